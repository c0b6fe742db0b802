"""PostgresSink: the runtime part of the two-phase-commit target for
PostgreSQL, built by its serialisable spec when bound
(:meth:`PostgresTarget.sink <airflow_eos.targets.postgres.target.PostgresTarget.sink>`).

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
- **commit**: one transaction, the core's protocol (:mod:`airflow_eos.core.commit`)
  with the publication of :meth:`PostgresSink.publish_in_decision`.
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

The package's modules, one job each: ``target`` (the spec), ``names`` (the
table-name parser, the target id, the modes), ``shape`` (what the target table
is, checked), ``staging`` (an attempt's staging tables and their seal) and
``publish`` (the commit's SQL per mode); the staging's COPY writer
(StagingWriter) is the shared one of :mod:`airflow_eos.staging`. This
module's sink runs each step's transaction and delegates to those.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, AttemptStatus, Checkpoint
from airflow_eos.core.commit import Published, Settlement
from airflow_eos.core.database import pg_message, redact, reused
from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable, NotPrepared, TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.sink import ForeignRecord, Sink
from airflow_eos.core.windows import Window
from airflow_eos.staging.tables import STAGING_SCHEMA, staging_ids
from airflow_eos.staging.writer import StagingWriter
from airflow_eos.targets.postgres import publish, shape, staging
from airflow_eos.targets.postgres.names import (
    ID_SCHEME,
    PARTITION_PER_WINDOW,
    parse_table_name,
    quoted_if_needed,
    table_identifier,
    table_target_id,
)

# psycopg is imported by the functions that use it, where a window runs.
if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _in_transaction(connection: contextlib.AbstractContextManager) -> Iterator[psycopg.Connection]:
    with connection as conn, conn.transaction():
        yield conn


@dataclass(frozen=True)
class PostgresSink(Sink):
    """The runtime sink of a bound
    :class:`~airflow_eos.targets.postgres.target.PostgresTarget` (which
    validates the table's settings, its fields here), bound to the database
    URL."""

    url: str = field(repr=False)
    table: str
    mode: str = "replace_window"
    key: tuple[str, ...] = ()
    on_committed: str = "skip"
    columns: tuple[str, ...] | None = None
    # The bound PostgresTarget that built this sink (not imported here: target.py
    # imports this module): the stage job ships it to its Spark tasks
    # (to_dict), which build the sink again from it.
    spec: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        if self.spec is None:
            raise ConfigurationError(f"{self!r} was not built by PostgresTarget.sink(): it has no spec to ship to "
                                     "the stage job's tasks")
        return self.spec.to_dict()

    @property
    def label(self) -> str:
        return self.table

    @property
    def replaces_committed(self) -> bool:
        return self.on_committed == "replace"

    @property
    def target_id(self) -> str:
        """``postgresql:schema.table`` (see :func:`~airflow_eos.targets.postgres.names.table_target_id`)."""
        return table_target_id(self.table)

    def claim_identity(self) -> str:
        """The table the name resolves to in the target database, as
        ``postgresql:schema.table`` (the form of :attr:`target_id`): a name
        without a schema resolves through the connection's search_path, which
        may not be ``public``. A table not created yet: :attr:`target_id`."""
        with self._connection("resolve target table") as conn:
            found = shape.resolved_name(conn, self._target)
        if found is None:
            return self.target_id
        return f"{ID_SCHEME}:" + ".".join(quoted_if_needed(part) for part in found)

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
    def ledger(self) -> Ledger:  # type: ignore[override]
        return Ledger(self.url)

    @property
    def _target(self) -> sql.Identifier:
        return table_identifier(self.table)

    @contextlib.contextmanager
    def _connection(self, purpose: str, hint: str = "") -> Iterator[psycopg.Connection]:
        """A connection to the target database for ``purpose`` (its
        application_name meanwhile), one this thread finished with if it can:
        each step of a window opens several, and a new session costs the
        server a fork and cold caches."""
        import psycopg
        try:
            with reused(self.url, "postgres target", doing=purpose) as conn:
                yield conn
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(
                f"{purpose} failed in {redact(self.url)}: {redact(str(exc), self.url)}{hint}") from exc

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
        return StagingWriter(self.url, attempt.staging, tuple(columns), self.table)

    def not_null_columns(self, columns: Sequence[str]) -> list[str]:
        """Those of ``columns`` that are NOT NULL in the target table (the stage
        job dead-letters a row with a null there rather than fail its COPY)."""
        from psycopg import sql
        schema, table = parse_table_name(self.table)
        ident = sql.Identifier(table) if schema is None else sql.Identifier(schema, table)
        with self._connection(f"describe {self.table}") as conn:
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

    def ledger_transaction(self, purpose: str, hint: str = "") -> contextlib.AbstractContextManager:
        """A fresh connection to the target database in a transaction; a lost
        connection is LedgerUnavailable, saying ``purpose`` (and ``hint``)."""
        return _in_transaction(self._connection(purpose, hint))

    def decision_transaction(self, attempt: Attempt) -> contextlib.AbstractContextManager:
        return self.ledger_transaction(f"commit {attempt}", "; retrying the commit is safe")

    def publish_in_decision(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint,
                            replacing: AttemptStatus | None, settlement: Settlement) -> Published:
        """Publish the checkpointed chunks in the decision's transaction (the
        protocol is :mod:`airflow_eos.core.commit`): ``replacing`` → delete the
        window's published rows first (partition_per_window: drop its
        partition); then ``INSERT … SELECT`` the rows (partition_per_window:
        attach the sealed staging as the window's partition) and the dead
        letters. Their counts must equal the checkpoint's (staging lost after
        prepare is refused, nothing published). On a target error the staging
        is kept for inspection until the attempt is aborted."""
        import psycopg
        from psycopg import sql
        rows_table, dead_table = staging_ids(attempt.staging)
        chunks = [c.chunk for c in checkpoint.chunks]
        try:
            described = self._describe(conn)
            columns = staging.staged_columns(conn, attempt.staging, self.columns)
            if columns is None:
                raise NotPrepared(f"cannot commit {attempt}: its staging {attempt.staging} is gone; "
                                  "stage the window again", missing=["staging table"])
            replaced = (publish.delete_window(conn, attempt, self._target, self.table, described, self.mode,
                                                replacing.committed_epoch) if replacing else 0)
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
        return Published(published, dead, replaced)

    # ------------------------------------------------------------------ abort

    def discard(self, attempt: Attempt, conn: psycopg.Connection | None = None) -> None:
        """Drop the attempt's staging tables, in the transaction that ends the
        attempt (it waits for a writer still staging into them, a zombie task)."""
        staging.drop(conn, attempt.staging)

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
