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

The package's modules, one job each: ``names`` (the table-name parser, the
modes), ``shape`` (what the target table is, checked), ``staging`` (an
attempt's staging tables shaped like the target, and their seal) and
``publish`` (the commit's SQL per mode). The staging tables' names, their
writer (StagingWriter: COPY, its encoding, dead letters) and the refusals it
reads are the shared staging's (:mod:`airflow_eos.staging`), which the Kafka
target stages through too. This module holds the PostgresTarget: the spec and the
sink, whose methods run each step's transaction and delegate to those.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import COMMITTED, Attempt, Checkpoint
from airflow_eos.core.columns import DEAD_LETTER_COLUMNS, LINEAGE_COLUMNS, WINDOW_COLUMNS
from airflow_eos.core.database import connect, pg_message, redact
from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable, NotPrepared, TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger, WindowState
from airflow_eos.core.sink import (ALREADY_COMMITTED, PUBLISHED, REPLACED, CommitResult, ForeignRecord, Sink,
                                   skip_committed)
from airflow_eos.core.target import DEFAULT_CONN_IDS, POSTGRES, ConnectionRef, TargetSpec, uri_part
from airflow_eos.core.windows import Window
from airflow_eos.staging.encoding import _csv
from airflow_eos.staging.tables import (
    CHUNK_COLUMN,
    DEAD_LETTER_SUFFIX,
    STAGING_SCHEMA,
    staging_ids,
)
from airflow_eos.staging.writer import StagingWriter
from airflow_eos.targets.postgres import publish, shape, staging
from airflow_eos.targets.postgres.names import (
    BOUND_CONSTRAINT,
    MODES,
    ON_COMMITTED,
    PARTITION_PER_WINDOW,
    SEALED_TRIGGER,
    parse_table_name,
    quoted_if_needed,
    table_identifier,
)

# psycopg and pyarrow are imported by the functions that use them: a DAG file
# builds a PostgresTarget at parse time, and parsing must not load them.
if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

log = logging.getLogger(__name__)

# Importable from here as before the package was split (other modules, tests, bench).
__all__ = [
    "PostgresTarget", "StagingWriter", "parse_table_name", "_csv", "STAGING_SCHEMA", "WINDOW_COLUMNS",
    "LINEAGE_COLUMNS", "CHUNK_COLUMN", "DEAD_LETTER_SUFFIX", "DEAD_LETTER_COLUMNS", "PARTITION_PER_WINDOW", "MODES",
    "BOUND_CONSTRAINT", "SEALED_TRIGGER", "ON_COMMITTED",
]


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
    postgres_conn_id: str = DEFAULT_CONN_IDS[POSTGRES]

    kind: ClassVar[str] = "postgres"
    id_scheme: ClassVar[str] = "postgresql"

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

    @classmethod
    def from_target_name(cls, name: str) -> "PostgresTarget":
        """The table ``name`` (``schema.table`` as :attr:`target_id` writes it)."""
        return cls(table=name)

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
        """``postgres://host:port/database/schema/table`` (the Postgres provider's
        form; schema ``public`` when the table names none), from the bound URL
        without its user or password."""
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(self._url())
        host = str(params.get("host") or "localhost").split(",")[0]
        port = str(params.get("port") or "5432").split(",")[0]
        database = params.get("dbname") or params.get("user") or "postgres"
        schema, table = parse_table_name(self.table)
        path = "/".join(uri_part(str(part)) for part in (database, schema or "public", table))
        return f"postgres://{uri_part(host)}:{uri_part(port)}/{path}"

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
    def replaces_committed(self) -> bool:
        return self.on_committed == "replace"

    @property
    def target_id(self) -> str:
        """The table's identity for the pipeline's claim in the ledger:
        ``postgresql:schema.table``, normalised so that ``analytics.orders`` and
        ``"analytics".ORDERS`` are one target. A part is double-quoted only where
        PostgreSQL would need it (``postgresql:"My Schema".orders``). A name
        without a schema is taken to be in ``public``, where PostgreSQL's default
        search_path puts it. The database needs no naming: the ledger lives in it."""
        schema, table = parse_table_name(self.table)
        return f"{self.id_scheme}:" + ".".join(quoted_if_needed(part) for part in (schema or "public", table))

    def claim_identity(self) -> str:
        """The table the name resolves to in the target database, as
        ``postgresql:schema.table`` (the form of :attr:`target_id`): a name
        without a schema resolves through the connection's search_path, which
        may not be ``public``. A table not created yet: :attr:`target_id`."""
        with self._connection("resolve target table") as conn:
            found = shape.resolved_name(conn, self._target)
        if found is None:
            return self.target_id
        return f"{self.id_scheme}:" + ".".join(quoted_if_needed(part) for part in found)

    def sweeps_unclaimed(self, attempt: Attempt) -> bool:
        """Yes: a pipeline claimed for no target (planned by a version before
        claims, or without its target) is taken to publish into PostgreSQL, as
        every pipeline was before targets were told apart; the sweep of any
        PostgreSQL target aborts its stale attempts and drops their staging in
        ``eos_staging``. In a ledger that also serves file targets, plan their
        pipelines with their target (the operators do): an unclaimed file
        pipeline's attempt swept here leaves its staging directory to the file
        target's sweep, which deletes the staging of ended attempts."""
        return True

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
        return table_identifier(self.table)

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

    # ------------------------------------------------------------------ begin

    def _describe(self, conn: psycopg.Connection) -> shape.Shape:
        return shape.describe(conn, self._target, self.table, self.url, mode=self.mode, key=self.key,
                              columns=self.columns)

    def begin(self, window: Window) -> Attempt:
        """Open an attempt and create its empty staging, in one transaction: a
        target that cannot take the rows fails here, before any Spark work,
        leaving no attempt behind."""
        with self._connection(f"begin {window}") as conn, conn.transaction():
            attempt = attempts.open_attempt(conn, window)
            described = self._describe(conn)
            staging.create(conn, attempt, self._target, described, self.mode)
        log.info("%s: staging %s.%s created for target %s (%d columns)", attempt, STAGING_SCHEMA,
                 attempt.staging, self.table, len(described.staged))
        return attempt

    # ------------------------------------------------------------------ stage

    def writer(self, attempt: Attempt) -> StagingWriter:
        with self._connection(f"writer {attempt}") as conn:
            columns = staging.staged_columns(conn, attempt.staging, self.columns)
        if columns is None:
            raise TargetError(f"staging of {attempt} does not exist: the attempt was aborted or committed")
        return self.staging_writer(attempt, columns)

    def staging_writer(self, attempt: Attempt, columns: Sequence[str]) -> StagingWriter:
        """The writer of ``columns`` of the attempt's staging, without asking the
        database (the stage job's write tasks know the columns)."""
        return StagingWriter(self._url(), attempt.staging, tuple(columns), self.table)

    def not_null_columns(self, columns: Sequence[str]) -> list[str]:
        """Those of ``columns`` that are NOT NULL in the target table (the stage
        job dead-letters a row with a null there rather than fail its COPY)."""
        from psycopg import sql
        schema, table = parse_table_name(self.table)
        ident = sql.Identifier(table) if schema is None else sql.Identifier(schema, table)
        with connect(self._url(), f"describe {self.table}") as conn:
            rows = conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
                " AND NOT attisdropped AND attnotnull", (ident.as_string(conn),),
            ).fetchall()
        return [c for (c,) in rows if c in columns]

    def seal(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> None:
        """partition_per_window, in the checkpoint's transaction: the staging is
        made to hold exactly the checkpoint, indexed as the target and sealed
        (see :func:`staging.seal`). Nothing in the other modes."""
        if self.mode == PARTITION_PER_WINDOW:
            staging.seal(conn, attempt, checkpoint, self._target, self.table)

    # ------------------------------------------------------------------ prepare

    def count_staged(self, attempt: Attempt) -> dict[int, tuple[int, int]] | None:
        import psycopg
        with self._connection(f"prepare {attempt}") as conn:
            try:
                return staging.count_chunks(conn, attempt.staging)
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
            there = staging.staged_columns(conn, attempt.staging, self.columns) is not None
        return [] if there else attempts.chunk_problems(checkpoint.chunks, None, attempt.staging)

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
        rows_table, dead_table = staging_ids(attempt.staging)
        with self._connection(f"commit {attempt}", "; retrying the commit is safe") as conn, conn.transaction():
            status = attempts.load_status(conn, attempt, lock=True)
            if status.state == COMMITTED:
                log.info("%s: committed before; nothing to do", attempt)
                # The offsets as they are now, so that a retry after a failure between
                # the commit and the offsets mirror still mirrors them.
                return CommitResult(attempt, ALREADY_COMMITTED, status.committed_epoch, status.published_rows,
                                    status.dead_letter_rows, offsets=attempts.load_offsets(conn, attempt.pipeline))
            replacing = status.window_state == WindowState.COMMITTED
            if replacing and not self.replaces_committed:
                staging.drop(conn, attempt.staging)
                return skip_committed(conn, attempt, status)
            attempts.check_committable(attempt, status)
            checkpoint = attempts.load_checkpoint(conn, attempt)
            chunks = [c.chunk for c in checkpoint.chunks]
            try:
                described = self._describe(conn)
                columns = staging.staged_columns(conn, attempt.staging, self.columns)
                if columns is None:
                    raise NotPrepared(f"cannot commit {attempt}: its staging {attempt.staging} is gone; "
                                      "stage the window again", missing=["staging table"])
                replaced = (publish.delete_window(conn, attempt, self._target, self.table, described, self.mode,
                                                    status.committed_epoch) if replacing else 0)
                # literals, not parameters: see the publish module's docstring
                values = {"pipeline": sql.Literal(attempt.pipeline), "window_start": sql.Literal(attempt.window_start),
                          "epoch": sql.Literal(attempt.epoch), "chunks": sql.Literal(chunks)}
                fault_point("commit.before_publish")
                if self.mode == PARTITION_PER_WINDOW:
                    published = publish.attach(conn, attempt, self._target, described, rows_table, checkpoint)
                else:
                    published = conn.execute(publish.insert_rows(self._target, columns, described, rows_table, values,
                                                                  self.mode, self.key)).rowcount
                fault_point("commit.after_publish")
                dead = publish.insert_dead_letters(conn, dead_table, values)
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                raise TargetError(f"cannot publish {attempt} into {self.table}: {pg_message(exc)}; "
                                  "staging kept until the attempt is aborted") from exc
            if (published, dead) != (checkpoint.row_count, checkpoint.dead_letter_count):
                raise NotPrepared(
                    f"cannot commit {attempt}: the checkpoint counted {checkpoint.row_count} rows and "
                    f"{checkpoint.dead_letter_count} dead letters, the staging holds {published} and {dead} "
                    "(staging lost or changed after prepare); nothing published, stage the window again",
                    missing=["staged rows"],
                )
            offsets = attempts.mark_committed(conn, attempt, published, dead)
            staging.drop(conn, attempt.staging)
        result = CommitResult(attempt, REPLACED if replacing else PUBLISHED, attempt.epoch, published, dead,
                              replaced, offsets, time.monotonic() - started)
        log.info("%s", result)
        return result

    # ------------------------------------------------------------------ abort

    def abort(self, attempt: Attempt, reason: str) -> bool:
        """Mark the attempt aborted and drop its staging in one transaction.
        Waits for a writer still staging into it (a zombie task) to finish."""
        with self._connection(f"abort {attempt}") as conn, conn.transaction():
            aborted = attempts.mark_aborted(conn, attempt, reason)
            fault_point("abort.inside")
            staging.drop(conn, attempt.staging)
        return aborted

    # ------------------------------------------------------------------ verify

    def published_relation(self, conn: psycopg.Connection, pipeline: str,
                           columns: tuple[str, ...] = ()) -> sql.Composed:
        """The pipeline's rows in the target table (see Sink.published_relation):
        the table must exist and have the window columns; the lineage columns
        are there if the table has all three."""
        return shape.published_relation(conn, self._target, self.table, self.url, pipeline, columns)

    def unattributed(self, conn: psycopg.Connection, pipeline: str, topics: Sequence[str]) -> Iterator[ForeignRecord]:
        """The whole table's rows of other pipelines from this pipeline's topics (see shape.unattributed)."""
        return shape.unattributed(conn, self._target, self.table, pipeline, topics)
