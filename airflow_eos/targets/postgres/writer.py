"""The writer of the PostgreSQL target: what a Spark task runs to stage its
rows (StagingWriter), the CSV encoding COPY reads, and the dead-letter rows.

A task COPYs its Arrow batches into the attempt's staging in one transaction
tagged with a fresh chunk id, and returns the chunk's counts. A task that fails
rolls its chunk back; a chunk that committed but never reached the job commit
(a task lost afterwards, a speculative copy) is not in the checkpoint and is
never published. psycopg and pyarrow are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core.attempt import StagedChunk
from airflow_eos.core.database import connect, redact
from airflow_eos.core.errors import LedgerUnavailable, TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.targets.postgres.names import CHUNK_COLUMN, STAGING_SCHEMA, pg_message, staging_ids

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class StagingWriter:
    """Stages rows of one attempt from inside Spark tasks. Plain data: pickle it
    into the tasks, or pass ``to_json()`` as a data source option.

    Call :meth:`write` once per task with the task's Arrow batches; return the
    StagedChunk to Spark as the task's commit message; on job commit pass every
    message's chunk to ``PostgresTarget.checkpoint``.
    """

    url: str
    staging: str
    columns: tuple[str, ...]
    target: str  # for messages

    def to_json(self) -> str:
        return json.dumps({"url": self.url, "staging": self.staging, "columns": list(self.columns),
                           "target": self.target})

    @classmethod
    def from_json(cls, text: str) -> "StagingWriter":
        data = json.loads(text)
        return cls(data["url"], data["staging"], tuple(data["columns"]), data["target"])

    def __repr__(self) -> str:
        return f"StagingWriter({STAGING_SCHEMA}.{self.staging} for {self.target} in {redact(self.url)})"

    def write(self, batches: Iterable[pa.RecordBatch | pa.Table],
              dead_letters: Iterable[pa.RecordBatch | pa.Table | Mapping] = ()) -> StagedChunk:
        """COPY the batches, then the dead letters, in one transaction as one
        chunk; all or nothing. ``dead_letters`` is read after ``batches`` is
        exhausted, so a list that the batches' generator fills works.

        Batches must have exactly the staged columns (any order). Dead letters
        have ``topic``, ``partition``, ``offset``, ``error`` and optionally
        ``key``, ``value`` (bytes).
        """
        import psycopg
        from psycopg import sql
        import pyarrow as pa
        chunk = secrets.randbits(63)
        digest = hashlib.blake2b(digest_size=16)
        rows = dead = 0
        started = time.monotonic()
        rows_table, dead_table = staging_ids(self.staging)
        conn = connect(self.url, f"stage {self.staging}")
        try:
            with conn.transaction():
                conn.execute("SET LOCAL TIME ZONE 'UTC'")  # zone-less timestamps are UTC
                conn.execute("SELECT set_config('eos.chunk', %s, true)", (str(chunk),))
                with conn.cursor() as cur:
                    batches = (b for b in batches if b.num_rows)
                    first = next(batches, None)
                    if first is not None:
                        order = self._check_columns(first.schema.names)
                        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                                rows_table, sql.SQL(", ").join(map(sql.Identifier, order)))) as copy:
                            for batch in itertools.chain([first], batches):
                                if batch.schema.names != order:
                                    self._check_columns(batch.schema.names)
                                    batch = batch.select(order)
                                payload = _csv(batch)
                                digest.update(payload)
                                copy.write(payload)
                                rows += batch.num_rows
                                fault_point("stage.mid_write")
                    with cur.copy(sql.SQL("COPY {} ({}, topic, partition, \"offset\", error, key, value) FROM STDIN")
                                  .format(dead_table, sql.Identifier(CHUNK_COLUMN))) as dl_copy:
                        for record in _dead_letter_rows(dead_letters):
                            digest.update(repr(record).encode())
                            dl_copy.write_row((chunk, *record))
                            dead += 1
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable) as exc:
            raise self._staging_error(exc, f"staging into {self.staging} for {self.target}") from exc
        except psycopg.Error as exc:
            raise TargetError(f"cannot stage rows for {self.target} into {STAGING_SCHEMA}.{self.staging}: "
                              f"{pg_message(exc)}") from exc
        except pa.ArrowException as exc:
            raise TargetError(f"cannot encode rows for {self.target}: {exc} (nested types need a cast to "
                              "string or JSON in the transform)") from exc
        finally:
            conn.close()
        seconds = time.monotonic() - started
        log.info("staged chunk %d into %s: %d rows, %d dead letters in %.2fs (%.0f rows/s)", chunk, self.staging,
                 rows, dead, seconds, rows / seconds if seconds else 0)
        return StagedChunk(chunk, rows, dead, digest.hexdigest())

    def _staging_error(self, exc: Exception, doing: str) -> Exception:
        """What write and refused_values raise for the two failures they share:
        the database lost (redacted) or the staging gone (its attempt ended)."""
        import psycopg

        if isinstance(exc, psycopg.errors.UndefinedTable):
            return TargetError(f"staging table {STAGING_SCHEMA}.{self.staging} of {self.target} does not exist: "
                               "its attempt was aborted or committed")
        return LedgerUnavailable(f"{doing}: lost the database {redact(self.url)}: {redact(str(exc), self.url)}")

    def refused_values(self, column: str,
                       values: pa.Array | pa.ChunkedArray) -> tuple[str, list[tuple[int, str, str]]]:
        """Ask the server which of ``values`` (one staged column, as a COPY would
        send them) that column's type cannot take: one round trip
        (eos.refused_inputs, ledger migration 6), however many are refused.
        Returns the column's PostgreSQL type and, for each refused value in row
        order, its row, its text as COPY received it and the server's error."""
        import psycopg
        rows_table, _ = staging_ids(self.staging)
        texts = _copy_texts(values)
        conn = connect(self.url, f"check {self.staging}")
        try:
            with conn.transaction():
                conn.execute("SET LOCAL TIME ZONE 'UTC'")  # as write() does
                found = conn.execute(
                    "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass"
                    " AND attname = %s AND attnum > 0 AND NOT attisdropped",
                    (rows_table.as_string(conn), column)).fetchone()
                if found is None:
                    raise TargetError(f"staging table {STAGING_SCHEMA}.{self.staging} of {self.target} has no "
                                      f"column {column!r}")
                refused = conn.execute("SELECT ordinal - 1, error FROM eos.refused_inputs(%s::regclass, %s, %s)"
                                       " ORDER BY ordinal", (rows_table.as_string(conn), column, texts)).fetchall()
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable) as exc:
            raise self._staging_error(exc, f"checking values for {self.target}") from exc
        except psycopg.errors.UndefinedFunction as exc:
            raise TargetError(f"the ledger of {redact(self.url)} lacks eos.refused_inputs: migrate it "
                              "(Ledger.migrate, version 6)") from exc
        finally:
            conn.close()
        return found[0], [(int(row), texts[row], str(error)) for row, error in refused]

    def _check_columns(self, names: list[str]) -> list[str]:
        if len(set(names)) != len(names) or set(names) != set(self.columns):
            unexpected = sorted(set(names) - set(self.columns))
            missing = [c for c in self.columns if c not in names]
            raise TargetError(f"rows for {self.target} must have exactly the columns {list(self.columns)}; "
                              f"unexpected: {unexpected}, missing: {missing}"
                              + (", duplicated names" if len(set(names)) != len(names) else ""))
        return list(names)


def _csv(batch: pa.RecordBatch | pa.Table) -> pa.Buffer:
    """Arrow → PostgreSQL CSV (nulls unquoted-empty, strings quoted)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    arrays = []
    for f, column in zip(batch.schema, batch.columns):
        t = f.type
        if pa.types.is_dictionary(t):
            column, t = column.cast(t.value_type), t.value_type
        if pa.types.is_timestamp(t) and t.tz is not None:
            # Arrow formats zoned timestamps ~20x slower; the instant's UTC wall
            # clock is the same instant in the writer's UTC session.
            column = column.cast(pa.timestamp(t.unit))
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            # bytea's hex input; Arrow's CSV writer refuses non-UTF-8 bytes
            column = pa.array([None if v is None else "\\x" + v.hex() for v in column.to_pylist()], pa.string())
        arrays.append(column)
    table = pa.Table.from_arrays(arrays, names=batch.schema.names)
    out = pa.BufferOutputStream()
    pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
    return out.getvalue()


def _copy_texts(values: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """Each value as the text COPY receives for it from :func:`_csv` (None for
    null): encoded by _csv itself and decoded as PostgreSQL's CSV input does
    (an unquoted empty field is null, a quoted one the empty string)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    payload = _csv(pa.table({"v": values}))
    parsed = pacsv.read_csv(
        pa.BufferReader(payload),
        read_options=pacsv.ReadOptions(column_names=["v"]),
        parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(column_types={"v": pa.string()}, strings_can_be_null=True,
                                             null_values=[""], quoted_strings_can_be_null=False))
    texts = parsed.column("v").to_pylist()
    if len(texts) != len(values):
        raise TargetError(f"could not re-read {len(values)} values as COPY text (got {len(texts)})")
    return texts


def _dead_letter_rows(dead_letters: Iterable[pa.RecordBatch | pa.Table | Mapping]) -> Iterator[tuple]:
    for item in dead_letters:
        records = [item] if isinstance(item, Mapping) else item.to_pylist()
        for r in records:
            missing = [k for k in ("topic", "partition", "offset", "error") if r.get(k) is None]
            if missing:
                raise TargetError(f"dead letter {r!r} lacks {missing}")
            yield (r["topic"], r["partition"], r["offset"], str(r["error"]), r.get("key"), r.get("value"))
