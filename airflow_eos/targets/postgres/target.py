"""PostgresTarget: the two-phase-commit sink for PostgreSQL.

The ledger and the target table share one database, so a window's rows, its
dead letters and the pipeline's offsets commit in one transaction. In the order
of a window's life:

- **begin** opens an attempt (new epoch) and, in the same transaction, creates its
  staging: two UNLOGGED tables in schema ``eos_staging`` named by the code, one
  with the target's columns (types copied from the target, so a wrong type fails
  while staging, with the column named) and one for dead letters.
- **StagingWriter.write** (inside a Spark task) COPYs Arrow batches into the
  staging in one transaction tagged with a fresh chunk id, and returns the
  chunk's counts. A task that fails rolls its chunk back; a chunk that committed
  but never reached the job commit (a task lost afterwards, a speculative copy) is
  not in the checkpoint and is never published.
- **prepare** (the sensor) compares the checkpoint's chunks with the staging.
- **commit**: one transaction, described in :meth:`PostgresTarget.commit`.
- **abort** drops the staging and marks the attempt aborted, atomically.

Unlogged staging is fast to fill and is emptied by a database crash; prepare and
commit both count it, so lost staging is re-staged, never half-published.

Mode ``partition_per_window`` publishes without copying rows. The target is
partitioned by ``RANGE (eos_window_start)`` and each window becomes one
partition: begin creates the staging as a (logged) table shaped like the target,
its window columns defaulting to the window and a CHECK constraint matching the
partition bound; the job commit seals it together with the checkpoint: under an
exclusive lock it drops rows of chunks that are not in the checkpoint, checks
that each checkpointed chunk holds what its task counted, builds the target's
indexes, and seals it (a trigger refuses every change). Logged and sealed, it
holds exactly the checkpoint from then on: prepare only checks it is there, and
the commit unseals it, moves it into the target's schema and attaches it
(``ATTACH PARTITION``) in the same transaction as the offsets, counting nothing
again. The constraint and indexes make the attach a
catalog change (no scan, no index build), so publishing 1M rows takes ~0.1 s
instead of seconds, and the heavy work happens where a failure only fails the
stage. The partition keeps the attempt's staging name: it says which attempt
published it.

Published rows carry the window in ``eos_pipeline`` / ``eos_window_start``
(required in mode ``replace_window``, so a rerun replaces exactly that window's
rows). Record-level pipelines should also keep the lineage columns
``eos_topic``, ``eos_partition``, ``eos_offset`` (the source record of each row):
``airflow-eos verify`` uses them to prove every record of the committed windows
was published exactly once. To the sink they are ordinary target columns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import re
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import COMMITTED, Attempt, Checkpoint, StagedChunk
from airflow_eos.core.faults import fault_point
from airflow_eos.core.errors import (
    ConfigurationError,
    InvalidCheckpoint,
    LedgerUnavailable,
    NotPrepared,
    TargetError,
)
from airflow_eos.core.database import connect, redact
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED, REPLACED, SKIPPED, CommitResult, Sink
from airflow_eos.core.target import POSTGRES, ConnectionRef, TargetSpec
from airflow_eos.core.windows import Window

# psycopg and pyarrow are imported by the functions that use them: a DAG file
# builds a PostgresTarget at parse time, and parsing must not load them.
if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from psycopg import sql

log = logging.getLogger(__name__)

STAGING_SCHEMA = "eos_staging"
WINDOW_COLUMNS = ("eos_pipeline", "eos_window_start")
LINEAGE_COLUMNS = ("eos_topic", "eos_partition", "eos_offset")
CHUNK_COLUMN = "eos_chunk"  # staging only: which writer transaction staged the row
DEAD_LETTER_SUFFIX = "_dl"
DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "error", "key", "value")
PARTITION_PER_WINDOW = "partition_per_window"
MODES = ("replace_window", "upsert", PARTITION_PER_WINDOW)
BOUND_CONSTRAINT = "eos_window_bound"  # partition_per_window: the staging's CHECK that matches the partition bound
SEALED_TRIGGER = "eos_sealed"  # partition_per_window: a sealed staging refuses changes (migration 4)
ON_COMMITTED = ("skip", "replace")


def parse_table_name(name: str) -> tuple[str | None, str]:
    """``table``, ``schema.table``, with any part double-quoted (``""`` escapes a
    quote) as in SQL; unquoted parts fold to lower case as PostgreSQL does. The
    parts are only ever used through ``sql.Identifier``."""
    parts: list[str] = []
    i, n = 0, len(name)
    while True:
        if i < n and name[i] == '"':
            chars, j = [], i + 1
            while True:
                k = name.find('"', j)
                if k < 0:
                    raise ConfigurationError(f"table name {name!r} has an unterminated quoted identifier")
                chars.append(name[j:k])
                if name.startswith('"', k + 1):
                    chars.append('"')
                    j = k + 2
                    continue
                break
            part, i = "".join(chars), k + 1
        else:
            k = name.find(".", i)
            k = n if k < 0 else k
            part = name[i:k].strip()
            if '"' in part:
                raise ConfigurationError(f"table name {name!r}: quote only whole parts, like \"my schema\".table")
            part, i = part.lower(), k
        if not part:
            raise ConfigurationError(f"table name {name!r} has an empty part")
        parts.append(part)
        if i == n:
            break
        if name[i] != ".":
            raise ConfigurationError(f"table name {name!r}: unexpected {name[i:]!r} after a quoted part")
        i += 1
    if len(parts) > 2:
        raise ConfigurationError(f"table name {name!r} has {len(parts)} parts; give table or schema.table")
    return (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])


def _quoted_if_needed(part: str) -> str:
    """A name part as PostgreSQL prints identifiers: bare when it reads back as
    itself unquoted, else double-quoted with quotes doubled."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", part):
        return part
    return '"' + part.replace('"', '""') + '"'


def _staging_ids(staging: str) -> tuple[sql.Identifier, sql.Identifier]:
    from psycopg import sql
    return sql.Identifier(STAGING_SCHEMA, staging), sql.Identifier(STAGING_SCHEMA, staging + DEAD_LETTER_SUFFIX)


def _pg_message(exc: psycopg.Error) -> str:
    """The server's words, including where (COPY line and column) when it says."""
    diag = exc.diag
    text = diag.message_primary or str(exc)
    extra = [d for d in (diag.message_detail, diag.message_hint, diag.context) if d]
    return text + (" (" + "; ".join(x.strip() for x in extra) + ")" if extra else "")


@dataclass(frozen=True)
class _Shape:
    """What begin and commit need to know of the target table."""

    staged: tuple[str, ...]  # columns the job writes, in the target's order
    window_columns: bool
    oid: int
    schema: str  # the target's schema (partition_per_window puts each window's partition there)


@dataclass(frozen=True)
class PostgresTarget(TargetSpec, Sink):
    """A PostgreSQL table as a two-phase-commit target.

    The spec and its sink are one object here: bound to its database URL (by
    the hook, from ``postgres_conn_id``, or given ``url`` outside Airflow), a
    PostgresTarget is the Sink (``sink()`` returns it).

    - ``url``: the target database, which also holds the ledger (schema ``eos``).
    - ``table``: ``table`` or ``schema.table`` (see parse_table_name). It must
      exist; the sink never creates or alters it.
    - ``mode``: ``replace_window`` (rows carry the window in ``eos_pipeline`` and
      ``eos_window_start``, which the commit fills) or ``upsert`` (``INSERT … ON
      CONFLICT (key) DO UPDATE``; ``key`` needs a unique index; the window
      columns are filled if the table has them) or ``partition_per_window``
      (the table is ``PARTITION BY RANGE (eos_window_start)`` and each window's
      staging is attached as its partition: no rows are copied at commit, see
      the module's docstring; unique indexes must include eos_window_start, as
      PostgreSQL requires of a partitioned table).
    - ``on_committed``: what committing a window that is already committed does:
      ``skip`` (nothing; reported) or ``replace`` (the window's published rows are
      replaced by this attempt's, atomically; in upsert mode the rows are
      upserted again, and rows still tagged with this window are deleted first;
      in partition_per_window mode the window's partition is dropped first).
    - ``columns``: the columns the job writes; default every column except the
      window columns and generated ones. Name them when the table has columns
      the job leaves to their defaults.
    """

    url: str | None = None
    table: str = ""
    mode: str = "replace_window"
    key: tuple[str, ...] = ()
    on_committed: str = "skip"
    columns: tuple[str, ...] | None = None
    # In a DAG the target names an Airflow connection instead of a URL; the
    # operators resolve it (with_url) where the connection can be read.
    postgres_conn_id: str = "postgres_default"

    kind: ClassVar[str] = "postgres"

    def __post_init__(self) -> None:
        if not self.table or not isinstance(self.table, str):
            raise ConfigurationError("PostgresTarget needs table='table' or table='schema.table'")
        if self.mode not in MODES:
            raise ConfigurationError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.on_committed not in ON_COMMITTED:
            raise ConfigurationError(f"on_committed must be one of {ON_COMMITTED}, not {self.on_committed!r}")
        if isinstance(self.key, str):
            object.__setattr__(self, "key", (self.key,))
        object.__setattr__(self, "key", tuple(self.key))
        if self.mode == "upsert" and not self.key:
            raise ConfigurationError("mode 'upsert' needs key columns")
        if self.mode != "upsert" and self.key:
            raise ConfigurationError("key columns are only used in mode 'upsert'")
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))
            bad = [c for c in self.columns if c in WINDOW_COLUMNS or c == CHUNK_COLUMN]
            if bad:
                raise ConfigurationError(f"columns {bad} are filled by the sink, not written by the job")
        parse_table_name(self.table)  # fail at DAG parse time, not at commit

    def __repr__(self) -> str:
        where = redact(self.url) if self.url else f"connection {self.postgres_conn_id!r}"
        return f"PostgresTarget({self.table!r} in {where}, mode={self.mode!r}, on_committed={self.on_committed!r})"

    def with_url(self, url: str) -> "PostgresTarget":
        return dataclasses.replace(self, url=url)

    # ------------------------------------------------------------------ the spec (core/target.py)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "table": self.table, "mode": self.mode, "key": list(self.key),
                "on_committed": self.on_committed,
                "columns": list(self.columns) if self.columns is not None else None,
                "postgres_conn_id": self.postgres_conn_id}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "PostgresTarget":
        fields = dict(fields)
        fields["key"] = tuple(fields.get("key") or ())
        if fields.get("columns") is not None:
            fields["columns"] = tuple(fields["columns"])
        return cls(**fields)

    def connections(self) -> tuple[ConnectionRef, ...]:
        return () if self.url else (ConnectionRef("ledger", POSTGRES, self.postgres_conn_id),)

    def bind(self, values: Mapping[str, Any]) -> "PostgresTarget":
        return self if self.url else self.with_url(values["ledger"])

    def sink(self) -> "PostgresTarget":
        self._url()
        return self

    @property
    def ledger_conn_id(self) -> str:
        return self.postgres_conn_id

    @property
    def asset_uri(self) -> str:
        return f"eos://{self.postgres_conn_id}/{self.table}"

    @property
    def label(self) -> str:
        return self.table

    def check_for_dag(self) -> None:
        if self.url:
            raise ConfigurationError("in a DAG, name the target database with postgres_conn_id, not a URL: "
                                     "a URL would put its password into the DAG and the task logs")

    def _url(self) -> str:
        if not self.url:
            raise ConfigurationError(f"{self!r} has no database URL: resolve postgres_conn_id with with_url()")
        return self.url

    @property
    def target_id(self) -> str:
        """The table's identity for the pipeline's claim in the ledger:
        ``postgresql:schema.table``, normalised so that ``analytics.orders`` and
        ``"analytics".ORDERS`` are one target. A part is double-quoted only where
        PostgreSQL would need it (``postgresql:"My Schema".orders``). A name
        without a schema is taken to be in ``public``, where PostgreSQL's default
        search_path puts it. The database needs no naming: the ledger lives in it."""
        schema, table = parse_table_name(self.table)
        return "postgresql:" + ".".join(_quoted_if_needed(part) for part in (schema or "public", table))

    @property
    def exclusive(self) -> bool:
        """The table takes the windows of one pipeline only: in
        partition_per_window each window is one of its partitions, and another
        pipeline's windows would overlap them."""
        return self.mode == PARTITION_PER_WINDOW

    @property
    def ledger(self) -> Ledger:  # type: ignore[override]
        return Ledger(self._url())

    @property
    def _target(self) -> sql.Identifier:
        from psycopg import sql
        schema, table = parse_table_name(self.table)
        return sql.Identifier(table) if schema is None else sql.Identifier(schema, table)

    @contextlib.contextmanager
    def _connection(self, purpose: str, hint: str = "") -> Iterator[psycopg.Connection]:
        import psycopg
        conn = connect(self._url(), purpose)
        try:
            yield conn
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(
                f"{purpose} failed in {redact(self.url)}: {redact(str(exc), self.url)}{hint}") from exc
        finally:
            conn.close()

    # ------------------------------------------------------------------ the target table

    def _describe(self, conn: psycopg.Connection) -> _Shape:
        """Check the target table can take what this sink stages; say clearly
        what is wrong when it cannot."""
        oid = conn.execute("SELECT to_regclass(%s)::oid", (self._target.as_string(conn),)).fetchone()[0]
        if oid is None:
            raise TargetError(f"target table {self.table} does not exist in {redact(self.url)}; create it first")
        kind, schema = conn.execute("SELECT c.relkind, n.nspname FROM pg_class c JOIN pg_namespace n"
                                    " ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,)).fetchone()
        if kind not in ("r", "p"):
            raise TargetError(f"target {self.table} is not a table (relkind {kind!r})")
        if self.mode == PARTITION_PER_WINDOW:
            self._check_partitioned_by_window(conn, oid, kind)
        rows = conn.execute(
            "SELECT attname, attgenerated <> '' OR attidentity = 'a' FROM pg_attribute"
            " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,),
        ).fetchall()
        names = [name for name, _ in rows]
        generated = {name for name, gen in rows if gen}
        if CHUNK_COLUMN in names:
            raise TargetError(f"target table {self.table} has a column {CHUNK_COLUMN!r}, which the sink reserves")
        window_columns = all(c in names for c in WINDOW_COLUMNS)
        if self.mode == "replace_window" and not window_columns:
            raise TargetError(
                f"target table {self.table} needs the columns eos_pipeline (text) and eos_window_start "
                "(timestamptz) in mode 'replace_window': they record each row's window so a rerun can replace it"
            )
        writable = [n for n in names if n not in WINDOW_COLUMNS and n not in generated]
        if self.columns is None:
            staged = tuple(writable)
        else:
            unknown = [c for c in self.columns if c not in writable]
            if unknown:
                raise TargetError(f"columns {unknown} are not writable columns of target table {self.table} "
                                  f"(writable: {writable})")
            staged = tuple(n for n in writable if n in self.columns)
        if self.mode == "upsert":
            missing = [k for k in self.key if k not in staged]
            if missing:
                raise TargetError(f"upsert key columns {missing} are not staged columns of {self.table}")
            unique = conn.execute(
                """
                SELECT EXISTS (
                    SELECT 1 FROM pg_index i
                    WHERE i.indrelid = %(oid)s AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
                      AND i.indnkeyatts = cardinality(%(key)s::text[])
                      AND (SELECT array_agg(a.attname::text) FROM pg_attribute a
                           WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey::int2[])) @> %(key)s::text[])
                """,
                {"oid": oid, "key": list(self.key)},
            ).fetchone()[0]
            if not unique:
                raise TargetError(f"upsert key ({', '.join(self.key)}) of {self.table} needs a unique index "
                                  "or primary key on exactly these columns")
        return _Shape(staged, window_columns, oid, schema)

    def _check_partitioned_by_window(self, conn: psycopg.Connection, oid: int, kind: str) -> None:
        wanted = (f"mode {PARTITION_PER_WINDOW!r} needs target table {self.table} partitioned by window, "
                  "created with PARTITION BY RANGE (eos_window_start): each window is attached as one partition")
        if kind != "p":
            raise TargetError(f"{wanted}; it is not partitioned")
        strategy, key = conn.execute(
            "SELECT p.partstrat, array(SELECT coalesce(a.attname::text, '(expression)')"
            " FROM unnest(p.partattrs::int2[]) WITH ORDINALITY k(attnum, i)"
            " LEFT JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = k.attnum ORDER BY k.i)"
            " FROM pg_partitioned_table p WHERE p.partrelid = %s", (oid,)).fetchone()
        if strategy != "r" or key != ["eos_window_start"]:
            how = {"r": "RANGE", "l": "LIST", "h": "HASH"}.get(strategy, strategy)
            raise TargetError(f"{wanted}; it is partitioned by {how} ({', '.join(key)})")

    # ------------------------------------------------------------------ begin

    def begin(self, window: Window) -> Attempt:
        """Open an attempt and create its empty staging, in one transaction: a
        target that cannot take the rows fails here, before any Spark work,
        leaving no attempt behind."""
        from psycopg import sql
        with self._connection(f"begin {window}") as conn, conn.transaction():
            attempt = attempts.open_attempt(conn, window)
            shape = self._describe(conn)
            rows_table, dead_table = _staging_ids(attempt.staging)
            if self.mode == PARTITION_PER_WINDOW:
                self._create_partition_staging(conn, attempt, rows_table)
            else:
                # CREATE TABLE AS copies names and types (with typmods), no constraints:
                # staging holds what the job wrote; the target's constraints apply at commit.
                conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
                    rows_table, sql.SQL(", ").join(map(sql.Identifier, shape.staged)), self._target))
            # Each writer transaction sets eos.chunk; COPY then tags rows without
            # the writer sending a column for it. (SET DEFAULT apart from ADD
            # COLUMN, which would evaluate the default once, now.)
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint NOT NULL").format(
                rows_table, sql.Identifier(CHUNK_COLUMN)))
            conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT current_setting('eos.chunk')::bigint")
                         .format(rows_table, sql.Identifier(CHUNK_COLUMN)))
            # Dead letters are staged like the rows: unlogged, but logged where the
            # rows' staging is (partition_per_window), so a crash keeps both or neither.
            conn.execute(sql.SQL(
                'CREATE {}TABLE {} ({} bigint NOT NULL, topic text NOT NULL, partition integer NOT NULL,'
                ' "offset" bigint NOT NULL, error text NOT NULL, key bytea, value bytea)'
            ).format(sql.SQL("" if self.mode == PARTITION_PER_WINDOW else "UNLOGGED "), dead_table,
                     sql.Identifier(CHUNK_COLUMN)))
        log.info("%s: staging %s.%s created for target %s (%d columns)", attempt, STAGING_SCHEMA,
                 attempt.staging, self.table, len(shape.staged))
        return attempt

    def _create_partition_staging(self, conn: psycopg.Connection, attempt: Attempt,
                                  rows_table: sql.Identifier) -> None:
        """partition_per_window: the staging is the future partition. Logged (it
        must survive as the published data), with the target's columns, defaults
        and CHECK constraints (checked while staging), the window columns
        defaulting to this window, and a CHECK matching the partition bound so
        that ATTACH PARTITION need not scan it. Indexes come at the seal, once."""
        from psycopg import sql
        start, end = sql.Literal(attempt.window_start), sql.Literal(attempt.window_end)
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
                             " INCLUDING GENERATED)").format(rows_table, self._target))
        conn.execute(sql.SQL(
            "ALTER TABLE {table} ALTER COLUMN eos_pipeline SET DEFAULT {pipeline}::text,"
            " ALTER COLUMN eos_window_start SET DEFAULT {start}::timestamptz,"
            " ADD CONSTRAINT {bound} CHECK (eos_window_start >= {start}::timestamptz"
            " AND eos_window_start < {end}::timestamptz)").format(
                table=rows_table, pipeline=sql.Literal(attempt.pipeline), start=start, end=end,
                bound=sql.Identifier(BOUND_CONSTRAINT)))

    # ------------------------------------------------------------------ stage

    def _staged_columns(self, conn: psycopg.Connection, attempt: Attempt) -> tuple[str, ...] | None:
        """The columns the writers COPY, None if the staging is gone. (A
        partition_per_window staging has all the target's columns; the window
        columns, generated ones and those left to defaults are not written.)"""
        rows_table, _ = _staging_ids(attempt.staging)
        rows = conn.execute(
            "SELECT attname, attgenerated <> '' FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
            " AND NOT attisdropped AND attname <> %s ORDER BY attnum",
            (rows_table.as_string(conn), CHUNK_COLUMN),
        ).fetchall()
        if not rows:
            return None
        return tuple(name for name, generated in rows if not generated and name not in WINDOW_COLUMNS
                     and (self.columns is None or name in self.columns))

    def writer(self, attempt: Attempt) -> StagingWriter:
        with self._connection(f"writer {attempt}") as conn:
            columns = self._staged_columns(conn, attempt)
        if columns is None:
            raise TargetError(f"staging of {attempt} does not exist: the attempt was aborted or committed")
        return StagingWriter(self.url, attempt.staging, columns, self.table)

    # ------------------------------------------------------------------ seal (with the checkpoint)

    def seal(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> None:
        """partition_per_window, in the checkpoint's transaction: make the staging
        hold exactly the checkpoint (_keep_checkpointed_chunks; a writer still
        copying finishes first), build the target's indexes on it, so that the
        commit only attaches, and seal it: a trigger refuses any change from
        then on (a write task still running after the job's commit, a hand), so
        prepare and commit need not count it again. A duplicate key fails here,
        failing the stage with the index named, not at commit."""
        import psycopg
        if self.mode != PARTITION_PER_WINDOW:
            return
        started = time.monotonic()
        rows_table, _ = _staging_ids(attempt.staging)
        try:
            self._unseal(conn, attempt)  # a retried job commit seals again
            dropped = self._keep_checkpointed_chunks(conn, attempt, checkpoint)
            built = self._build_target_indexes(conn, attempt, rows_table)
            self._refuse_changes(conn, attempt)
        except psycopg.errors.UndefinedTable as exc:
            raise TargetError(f"staging of {attempt} does not exist: the attempt was aborted or committed") from exc
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            raise TargetError(f"cannot seal the staging of {attempt} as a partition of {self.table}: "
                              f"{_pg_message(exc)}") from exc
        log.info("%s: staging sealed in %.2fs: %d index(es) of %s built, %d rows of chunks not in the checkpoint "
                 "removed", attempt, time.monotonic() - started, built, self.table, dropped)

    @staticmethod
    def _refuse_changes(conn: psycopg.Connection, attempt: Attempt) -> None:
        """The seal proper: from now on the staging's tables refuse every change."""
        from psycopg import sql
        for table in _staging_ids(attempt.staging):
            conn.execute(sql.SQL("CREATE TRIGGER {} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {}"
                                 " FOR EACH STATEMENT EXECUTE FUNCTION eos.refuse_change_to_sealed_staging()"
                                 ).format(sql.Identifier(SEALED_TRIGGER), table))

    @staticmethod
    def _unseal(conn: psycopg.Connection, attempt: Attempt) -> None:
        from psycopg import sql
        for table in _staging_ids(attempt.staging):
            conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(SEALED_TRIGGER), table))

    def _keep_checkpointed_chunks(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> int:
        """Lock the staging, delete what chunks the checkpoint does not name left
        in it (a task that staged but never reached the job commit: lost after
        its chunk committed, or a speculative copy), and check each checkpointed
        chunk holds what its task counted. Returns the rows deleted. The one
        scan of the staging in a window's life (see the module's docstring)."""
        from psycopg import sql
        rows_table, dead_table = _staging_ids(attempt.staging)
        conn.execute(sql.SQL("LOCK TABLE {}, {} IN ACCESS EXCLUSIVE MODE").format(rows_table, dead_table))
        counts = self._count_chunks(conn, attempt)
        listed = {c.chunk for c in checkpoint.chunks}
        unlisted = [c for c in counts if c not in listed]
        if unlisted:
            for table in (rows_table, dead_table):
                conn.execute(sql.SQL("DELETE FROM {} WHERE {} = ANY({}::bigint[])").format(
                    table, sql.Identifier(CHUNK_COLUMN), sql.Literal(unlisted)))
        problems = attempts.chunk_problems(checkpoint.chunks, counts, attempt.staging)
        if problems:
            raise InvalidCheckpoint(f"{attempt}: the staging does not hold what the write tasks reported, no "
                                    "checkpoint written:\n  " + "\n  ".join(problems))
        return sum(counts[c][0] for c in unlisted)

    def _build_target_indexes(self, conn: psycopg.Connection, attempt: Attempt, rows_table: sql.Identifier) -> int:
        """Build on the staging an equivalent of each of the target's indexes
        (a constraint's as that constraint), which ATTACH PARTITION then adopts
        instead of building. Named after the staging; a repeated seal (a retried
        job commit) skips those already built."""
        from psycopg import sql
        indexes = conn.execute(
            "SELECT pg_get_indexdef(i.indexrelid), pg_get_constraintdef(c.oid),"
            " quote_ident(n.nspname) || '.' || quote_ident(t.relname)"
            " FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace"
            " LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid"
            " AND c.contype IN ('p', 'u', 'x')"  # not a self-referencing foreign key, which also names the index
            " WHERE i.indrelid = to_regclass(%s) ORDER BY i.indexrelid", (self._target.as_string(conn),),
        ).fetchall()
        built = 0
        for k, (index_def, constraint_def, qualified) in enumerate(indexes, 1):
            name = f"{attempt.staging}_i{k}"
            if conn.execute("SELECT to_regclass(%s)", (sql.Identifier(STAGING_SCHEMA, name).as_string(conn),)
                            ).fetchone()[0] is not None:
                continue
            if constraint_def is not None:  # definitions as the server prints them: quoted, safe to reuse
                statement = sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(rows_table, sql.Identifier(name))
                conn.execute(statement + sql.SQL(constraint_def))
            else:
                marker = f" ON ONLY {qualified} "
                at = index_def.find(marker)
                if at < 0:
                    raise TargetError(f"cannot build index {index_def!r} of {self.table} on the staging")
                unique = "UNIQUE " if index_def.startswith("CREATE UNIQUE INDEX ") else ""
                statement = sql.SQL(f"CREATE {unique}INDEX {{}} ON {{}} ").format(sql.Identifier(name), rows_table)
                conn.execute(statement + sql.SQL(index_def[at + len(marker):]))
            built += 1
        return built

    # ------------------------------------------------------------------ prepare

    def count_staged(self, attempt: Attempt) -> dict[int, tuple[int, int]] | None:
        import psycopg
        with self._connection(f"prepare {attempt}") as conn:
            try:
                return self._count_chunks(conn, attempt)
            except psycopg.errors.UndefinedTable:
                return None

    def staging_problems(self, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        """partition_per_window: the seal checked the staging against the
        checkpoint, in the checkpoint's transaction; it is logged (a crash keeps
        it) and sealed (nothing can change it since), so it only has to be
        there. Other modes count it: unlogged staging is emptied by a crash."""
        if self.mode != PARTITION_PER_WINDOW:
            return super().staging_problems(attempt, checkpoint)
        with self._connection(f"prepare {attempt}") as conn:
            there = self._staged_columns(conn, attempt) is not None
        return [] if there else attempts.chunk_problems(checkpoint.chunks, None, attempt.staging)

    @staticmethod
    def _count_chunks(conn: psycopg.Connection, attempt: Attempt) -> dict[int, tuple[int, int]]:
        """chunk -> (rows, dead letters) in the staging."""
        from psycopg import sql
        rows_table, dead_table = _staging_ids(attempt.staging)
        rows = conn.execute(sql.SQL("SELECT {0}, count(*) FROM {1} GROUP BY {0}").format(
            sql.Identifier(CHUNK_COLUMN), rows_table)).fetchall()
        dead = conn.execute(sql.SQL("SELECT {0}, count(*) FROM {1} GROUP BY {0}").format(
            sql.Identifier(CHUNK_COLUMN), dead_table)).fetchall()
        counts = {chunk: (n, 0) for chunk, n in rows}
        for chunk, n in dead:
            counts[chunk] = (counts.get(chunk, (0, 0))[0], n)
        return counts

    # ------------------------------------------------------------------ commit

    def commit(self, attempt: Attempt) -> CommitResult:
        """Publish a prepared attempt. One transaction:

        1. lock the window row, then the attempt row (begin and abort of the
           window wait; a second commit waits, then finds it done);
        2. this attempt committed before → no-op, reported; the window committed
           by another attempt → ``skip``: no-op (this attempt's staging is
           dropped) or ``replace``: delete the window's published rows first
           (partition_per_window: drop its partition);
        3. the attempt must hold the current epoch and be prepared;
        4. ``INSERT … SELECT`` the checkpointed chunks' rows (partition_per_window:
           attach the sealed staging as the window's partition) and dead
           letters; their counts must equal the checkpoint's (staging lost after
           prepare is refused, nothing published);
        5. mark window and attempt committed, advance the pipeline's offsets to
           the contiguous committed prefix, drop the staging.

        A failure anywhere rolls all of it back. On a target error the staging
        is kept for inspection until the attempt is aborted. If the connection
        is lost, the outcome is "rolled back" unless it was lost during COMMIT
        itself; either way retrying is safe.
        """
        import psycopg
        from psycopg import sql
        started = time.monotonic()
        rows_table, dead_table = _staging_ids(attempt.staging)
        with self._connection(f"commit {attempt}", "; retrying the commit is safe") as conn, conn.transaction():
            status = attempts.load_status(conn, attempt, lock=True)
            if status.state == COMMITTED:
                log.info("%s: committed before; nothing to do", attempt)
                # The offsets as they are now, so that a retry after a failure between
                # the commit and the offsets mirror still mirrors them.
                return CommitResult(attempt, ALREADY_COMMITTED, status.committed_epoch, status.published_rows,
                                    status.dead_letter_rows, offsets=attempts.load_offsets(conn, attempt.pipeline))
            replacing = status.window_state == COMMITTED
            if replacing and self.on_committed == "skip":
                attempts.mark_aborted(conn, attempt, f"window already committed by attempt {status.committed_epoch};"
                                                     " on_committed='skip'")
                self._drop_staging(conn, attempt)
                result = CommitResult(attempt, SKIPPED, status.committed_epoch, status.published_rows,
                                      status.dead_letter_rows, offsets=attempts.load_offsets(conn, attempt.pipeline))
                log.info("%s", result)
                return result
            attempts.check_committable(attempt, status)
            checkpoint = attempts.load_checkpoint(conn, attempt)
            chunks = [c.chunk for c in checkpoint.chunks]
            try:
                shape = self._describe(conn)
                columns = self._staged_columns(conn, attempt)
                if columns is None:
                    raise NotPrepared(f"cannot commit {attempt}: its staging {attempt.staging} is gone; "
                                      "stage the window again", missing=["staging table"])
                replaced = self._delete_window(conn, attempt, shape, status.committed_epoch) if replacing else 0
                # Values go in as literals, not parameters: with parameters psycopg
                # would read a '%' inside a quoted (hostile) table name as a placeholder.
                values = {"pipeline": sql.Literal(attempt.pipeline), "window_start": sql.Literal(attempt.window_start),
                          "epoch": sql.Literal(attempt.epoch), "chunks": sql.Literal(chunks)}
                fault_point("commit.before_publish")
                if self.mode == PARTITION_PER_WINDOW:
                    published = self._attach(conn, attempt, shape, rows_table, checkpoint)
                else:
                    published = conn.execute(self._publish_sql(columns, shape, rows_table, values)).rowcount
                fault_point("commit.after_publish")
                dead = conn.execute(
                    sql.SQL('INSERT INTO eos.dead_letters (pipeline, window_start, epoch, topic, partition, "offset",'
                            ' error, key, value) SELECT {pipeline}::text, {window_start}::timestamptz, {epoch}::int,'
                            ' topic, partition, "offset", error, key, value FROM {table}'
                            ' WHERE {chunk} = ANY({chunks}::bigint[])'
                            ).format(table=dead_table, chunk=sql.Identifier(CHUNK_COLUMN), **values),
                ).rowcount
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                raise TargetError(f"cannot publish {attempt} into {self.table}: {_pg_message(exc)}; "
                                  "staging kept until the attempt is aborted") from exc
            if (published, dead) != (checkpoint.row_count, checkpoint.dead_letter_count):
                raise NotPrepared(
                    f"cannot commit {attempt}: the checkpoint counted {checkpoint.row_count} rows and "
                    f"{checkpoint.dead_letter_count} dead letters, the staging holds {published} and {dead} "
                    "(staging lost or changed after prepare); nothing published, stage the window again",
                    missing=["staged rows"],
                )
            offsets = attempts.mark_committed(conn, attempt, published, dead)
            self._drop_staging(conn, attempt)
        result = CommitResult(attempt, REPLACED if replacing else PUBLISHED, attempt.epoch, published, dead,
                              replaced, offsets, time.monotonic() - started)
        log.info("%s", result)
        return result

    def _delete_window(self, conn: psycopg.Connection, attempt: Attempt, shape: _Shape, committed_epoch: int) -> int:
        from psycopg import sql
        conn.execute("DELETE FROM eos.dead_letters WHERE pipeline = %s AND window_start = %s",
                     (attempt.pipeline, attempt.window_start))
        if self.mode == PARTITION_PER_WINDOW:
            return self._drop_partition(conn, attempt, shape, committed_epoch)
        if not shape.window_columns:  # upsert without window columns: the upsert overwrites
            return 0
        return conn.execute(  # literals, not parameters: see commit()
            sql.SQL("DELETE FROM {} WHERE eos_pipeline = {}::text AND eos_window_start = {}::timestamptz").format(
                self._target, sql.Literal(attempt.pipeline), sql.Literal(attempt.window_start)),
        ).rowcount

    def _drop_partition(self, conn: psycopg.Connection, attempt: Attempt, shape: _Shape, committed_epoch: int) -> int:
        """partition_per_window's replace: drop the partition the committed
        attempt attached (only a partition of the target by that name)."""
        from psycopg import sql
        name = attempts.staging_name(attempt.pipeline, attempt.window_start, committed_epoch)
        found = conn.execute(
            "SELECT c.oid FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s AND c.relname = %s", (shape.oid, name)).fetchone()
        if found is None:
            raise TargetError(f"cannot replace {attempt.window} in {self.table}: its partition {name}, attached by "
                              f"attempt {committed_epoch}, is no longer a partition of it")
        partition = sql.Identifier(shape.schema, name)
        rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(partition)).fetchone()[0]
        conn.execute(sql.SQL("DROP TABLE {}").format(partition))
        return rows

    def _attach(self, conn: psycopg.Connection, attempt: Attempt, shape: _Shape, rows_table: sql.Identifier,
                checkpoint: Checkpoint) -> int:
        """partition_per_window's publish: the sealed staging becomes the window's
        partition, by catalog changes only (the seal built the indexes, the
        bound's CHECK spares ATTACH its scan). Returns the rows published: the
        checkpoint's, which the seal found in the staging (sealed since)."""
        from psycopg import sql
        self._unseal(conn, attempt)
        partition = sql.Identifier(shape.schema, attempt.staging)
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(rows_table, sql.Identifier(CHUNK_COLUMN)))
        conn.execute(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(rows_table, sql.Identifier(shape.schema)))
        conn.execute(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}::timestamptz)"
                             " TO ({}::timestamptz)").format(self._target, partition,
                                                             sql.Literal(attempt.window_start),
                                                             sql.Literal(attempt.window_end)))
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(partition, sql.Identifier(BOUND_CONSTRAINT)))
        return checkpoint.row_count

    def _publish_sql(self, columns: tuple[str, ...], shape: _Shape, rows_table: sql.Identifier,
                     values: dict[str, sql.Literal]) -> sql.Composed:
        """``values``: literals of pipeline, window_start and chunks (the checkpointed chunk ids)."""
        from psycopg import sql
        target_columns = list(columns) + (list(WINDOW_COLUMNS) if shape.window_columns else [])
        selected = [sql.Identifier(c) for c in columns]
        if shape.window_columns:
            selected += [sql.SQL("{}::text").format(values["pipeline"]),
                         sql.SQL("{}::timestamptz").format(values["window_start"])]
        statement = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} = ANY({}::bigint[])").format(
            self._target, sql.SQL(", ").join(map(sql.Identifier, target_columns)), sql.SQL(", ").join(selected),
            rows_table, sql.Identifier(CHUNK_COLUMN), values["chunks"])
        if self.mode == "upsert":
            updated = [c for c in target_columns if c not in self.key] or [self.key[0]]
            statement += sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(
                sql.SQL(", ").join(map(sql.Identifier, self.key)),
                sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updated))
        return statement

    # ------------------------------------------------------------------ abort

    def _drop_staging(self, conn: psycopg.Connection, attempt: Attempt) -> None:
        from psycopg import sql
        for table in _staging_ids(attempt.staging):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))

    def abort(self, attempt: Attempt, reason: str) -> bool:
        """Mark the attempt aborted and drop its staging in one transaction.
        Waits for a writer still staging into it (a zombie task) to finish."""
        with self._connection(f"abort {attempt}") as conn, conn.transaction():
            aborted = attempts.mark_aborted(conn, attempt, reason)
            fault_point("abort.inside")
            self._drop_staging(conn, attempt)
        return aborted


# --------------------------------------------------------------------------- the writer


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
        rows_table, dead_table = _staging_ids(self.staging)
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
                              f"{_pg_message(exc)}") from exc
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
        rows_table, _ = _staging_ids(self.staging)
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
