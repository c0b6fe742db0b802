"""The staging's writer: what a Spark task runs to stage its rows
(StagingWriter) and the dead-letter rows into an attempt's staging tables, for
every target that stages there; the encoding COPY reads
(binary when the staged types allow it, else CSV) is :mod:`.encoding`'s.

A task COPYs its Arrow batches into the attempt's staging in one transaction
tagged with a fresh chunk id, and returns the chunk's counts. A task that fails
rolls its chunk back; a chunk that committed but never reached the job commit
(a task lost afterwards, a speculative copy) is not in the checkpoint and is
never published. psycopg and pyarrow are imported inside the functions.

A value a staged column's type cannot take fails the whole COPY; the writer
reads which row and column the server refused (:meth:`StagingWriter.refusal`)
and which values of a column it refuses (:meth:`StagingWriter.refused_values`),
the questions of :class:`~airflow_eos.core.roles.RefusingWriter`, so that the
stage job can dead-letter those rows without knowing PostgreSQL's diagnostics.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core.attempt import StagedChunk
from airflow_eos.core.database import pg_message, redact, reused
from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable, TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.sink import dead_letters_as_rows
from airflow_eos.staging.encoding import (
    NUL_REFUSED,
    CopyFormat,
    column_types,
    copy_texts,
    encoder_for,
    row_of_line,
    split_nul,
)
from airflow_eos.staging.tables import CHUNK_COLUMN, STAGING_SCHEMA, staging_ids

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

log = logging.getLogger(__name__)

class CopyRefused(TargetError):
    """A COPY into the staging failed on the server; ``format`` is the chunk's
    COPY format (a refused row's ``line`` means a different thing in each)."""

    def __init__(self, message: str, copy_format: CopyFormat):
        super().__init__(message)
        self.copy_format = copy_format


@dataclass(frozen=True)
class CopyRefusal:
    """The server refused the row at ``line`` of a COPY into the staging, for
    a value of ``column`` when it names one (a RowRefusal)."""

    line: int
    message: str
    column: str | None = None
    copy_format: CopyFormat = CopyFormat.CSV

    def row(self, table: pa.Table) -> int | None:
        """The refused row of ``table`` (what the COPY sent), if it can be told."""
        return row_of_line(self.copy_format, table, self.line)


def _copy_dead_letters(cur, dead_table, chunk: int, dead_letters: Iterable[pa.RecordBatch | pa.Table | Mapping],
                       digest) -> int:
    """COPY the dead letters into the dead letters table as rows of ``chunk``;
    returns how many. ``digest`` takes each of them (the chunk's checksum)."""
    from psycopg import sql

    dead = 0
    with cur.copy(sql.SQL("COPY {} ({}, topic, partition, \"offset\", error, key, value) FROM STDIN")
                  .format(dead_table, sql.Identifier(CHUNK_COLUMN))) as copy:
        for record in dead_letters_as_rows(dead_letters):
            digest.update(repr(record).encode())
            copy.write_row((chunk, *record))
            dead += 1
    return dead


@dataclass(frozen=True)
class StagingWriter:
    """Stages rows of one attempt from inside Spark tasks. Plain data: pickle it
    into the tasks, or pass ``to_json()`` as a data source option.

    Call :meth:`write` once per task with the task's Arrow batches; return the
    StagedChunk to Spark as the task's commit message; on job commit pass every
    message's chunk to the sink's ``checkpoint``.
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
        import pyarrow as pa
        chunk = secrets.randbits(63)
        digest = hashlib.blake2b(digest_size=16)
        rows = dead = 0
        fmt = CopyFormat.CSV
        started = time.monotonic()
        rows_table, dead_table = staging_ids(self.staging)
        try:
            with self._connection(f"stage {self.staging}") as conn, conn.transaction():
                conn.execute("SET LOCAL TIME ZONE 'UTC'")  # zone-less timestamps are UTC
                conn.execute("SELECT set_config('eos.chunk', %s, true)", (str(chunk),))
                with conn.cursor() as cur:
                    batches = (b for b in batches if b.num_rows)
                    first = next(batches, None)
                    if first is not None:
                        order = self._check_columns(first.schema.names)
                        encoder = encoder_for(first.schema, column_types(conn, rows_table))
                        fmt = encoder.format
                        rows = self._copy_rows(cur, rows_table, order, encoder, itertools.chain([first], batches),
                                               digest)
                    dead = _copy_dead_letters(cur, dead_table, chunk, dead_letters, digest)
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable) as exc:
            raise self._staging_error(exc, f"staging into {self.staging} for {self.target}") from exc
        except psycopg.Error as exc:
            raise CopyRefused(f"cannot stage rows for {self.target} into {STAGING_SCHEMA}.{self.staging}: "
                              f"{pg_message(exc)}", fmt) from exc
        except ConfigurationError:  # the database URL (a ValueError too), not the rows
            raise
        except (pa.ArrowException, ValueError) as exc:  # pgpq raises ValueError for what it cannot encode
            raise TargetError(f"cannot encode rows for {self.target}: {exc} (nested types need a cast to "
                              "string or JSON in the transform)") from exc
        seconds = time.monotonic() - started
        log.info("staged chunk %d into %s: %d rows (%s COPY), %d dead letters in %.2fs (%.0f rows/s)", chunk,
                 self.staging, rows, fmt.value, dead, seconds, rows / seconds if seconds else 0)
        return StagedChunk(chunk, rows, dead, digest.hexdigest())

    def _copy_rows(self, cur, rows_table, order: list[str], encoder, batches: Iterable[pa.RecordBatch | pa.Table],
                   digest) -> int:
        """COPY the batches into the rows table, each in the column ``order``,
        in ``encoder``'s format; returns how many rows. ``digest`` takes every
        payload (the chunk's checksum)."""
        from psycopg import sql

        rows = 0
        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(
                rows_table, sql.SQL(", ").join(map(sql.Identifier, order)), sql.SQL(encoder.option))) as copy:
            copy.write(encoder.header())
            for batch in batches:
                if batch.schema.names != order:
                    self._check_columns(batch.schema.names)
                    batch = batch.select(order)
                payload = encoder.encode(batch)
                digest.update(payload)
                copy.write(payload)
                rows += batch.num_rows
                fault_point("stage.mid_write")
            copy.write(encoder.trailer())
        return rows

    def _connection(self, doing: str) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """A connection for ``doing``, one this process's thread finished with if
        it can: a Spark worker writes many chunks, each in its own transaction."""
        return reused(self.url, "staging writer", doing=doing)

    def _staging_error(self, exc: Exception, doing: str) -> Exception:
        """What write and refused_values raise for the two failures they share:
        the database lost (redacted) or the staging gone (its attempt ended)."""
        import psycopg

        if isinstance(exc, psycopg.errors.UndefinedTable):
            return TargetError(f"staging table {STAGING_SCHEMA}.{self.staging} of {self.target} does not exist: "
                               "its attempt was aborted or committed")
        return LedgerUnavailable(f"{doing}: lost the database {redact(self.url)}: {redact(str(exc), self.url)}")

    def refusal(self, error: Exception) -> CopyRefusal | None:
        """The row the server refused, if ``error`` (raised by :meth:`write`)
        was a value a staged column's type cannot take: a data exception
        (SQLSTATE class 22) in this staging's COPY, whose context names the
        line and, when it can, the column (one of :attr:`columns`). None for
        any other failure."""
        import psycopg

        cause = error.__cause__
        if not isinstance(cause, psycopg.Error) or not (cause.sqlstate or "").startswith("22"):
            return None
        match = re.search(r"COPY (\S+), line (\d+)(?:, (.*))?", cause.diag.context or "")
        if match is None or match.group(1) != self.staging:
            return None
        where = match.group(3) or ""
        # "column NAME: VALUE"; a name may itself hold ": ", so match the known names, longest first.
        column = next((c for c in sorted(self.columns, key=len, reverse=True)
                       if where == f"column {c}" or where.startswith(f"column {c}: ")), None)
        return CopyRefusal(int(match.group(2)),
                           (cause.diag.message_primary or str(cause)) + (f" ({where})" if where else ""),
                           column, getattr(error, "copy_format", CopyFormat.CSV))

    def refused_values(self, column: str,
                       values: pa.Array | pa.ChunkedArray) -> tuple[str, list[tuple[int, str, str]]]:
        """Ask the server which of ``values`` (one staged column, as a COPY would
        send them) that column's type cannot take: one round trip
        (eos.refused_inputs, ledger migration 6), however many are refused.
        Returns the column's PostgreSQL type and, for each refused value in row
        order, its row, its text as COPY received it and the server's error."""
        import psycopg
        rows_table, _ = staging_ids(self.staging)
        texts = copy_texts(values)
        asked, nul = split_nul(texts)
        try:
            with self._connection(f"check {self.staging}") as conn, conn.transaction():
                conn.execute("SET LOCAL TIME ZONE 'UTC'")  # as write() does
                found = conn.execute(
                    "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass"
                    " AND attname = %s AND attnum > 0 AND NOT attisdropped",
                    (rows_table.as_string(conn), column)).fetchone()
                if found is None:
                    raise TargetError(f"staging table {STAGING_SCHEMA}.{self.staging} of {self.target} has no "
                                      f"column {column!r}")
                refused = conn.execute("SELECT ordinal - 1, error FROM eos.refused_inputs(%s::regclass, %s, %s)"
                                       " ORDER BY ordinal", (rows_table.as_string(conn), column, asked)).fetchall()
        except (psycopg.OperationalError, psycopg.errors.UndefinedTable) as exc:
            raise self._staging_error(exc, f"checking values for {self.target}") from exc
        except psycopg.errors.UndefinedFunction as exc:
            raise TargetError(f"the ledger of {redact(self.url)} lacks eos.refused_inputs: migrate it "
                              "(Ledger.migrate, version 6)") from exc
        refused = [(int(row), texts[row], str(error)) for row, error in refused]
        refused += [(row, text, NUL_REFUSED) for row, text in nul.items()]
        return found[0], sorted(refused)

    def _check_columns(self, names: list[str]) -> list[str]:
        if len(set(names)) != len(names) or set(names) != set(self.columns):
            unexpected = sorted(set(names) - set(self.columns))
            missing = [c for c in self.columns if c not in names]
            raise TargetError(f"rows for {self.target} must have exactly the columns {list(self.columns)}; "
                              f"unexpected: {unexpected}, missing: {missing}"
                              + (", duplicated names" if len(set(names)) != len(names) else ""))
        return list(names)
