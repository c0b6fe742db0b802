"""An attempt's staging in the PostgreSQL target: the shared staging's two
tables (:mod:`airflow_eos.staging.tables`: schema ``eos_staging``, named by the
attempt, one for its rows, each tagged with the chunk, the writer transaction,
that staged it, and one for its dead letters), its rows' table shaped like the
target table.

Begin creates them (UNLOGGED, with the target's column types, so a wrong type
fails while staging, with the column named; in ``partition_per_window`` a
logged table shaped like the target, which becomes the window's partition).
Prepare counts them chunk by chunk (``count_chunks``). In
``partition_per_window`` the job commit seals them (:func:`seal`); commit and
abort drop them (``drop``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, Checkpoint
from airflow_eos.core.columns import WINDOW_COLUMNS
from airflow_eos.core.database import pg_message
from airflow_eos.core.errors import InvalidCheckpoint, TargetError
from airflow_eos.staging.tables import (
    CHUNK_COLUMN,
    CHUNK_DEFAULT,
    STAGING_SCHEMA,
    count_chunks,
    create_dead_letters,
    drop,
    staging_ids,
)
from airflow_eos.targets.postgres.names import BOUND_CONSTRAINT, PARTITION_PER_WINDOW, SEALED_TRIGGER
from airflow_eos.targets.postgres.shape import Shape

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

log = logging.getLogger(__name__)


def create(conn: psycopg.Connection, attempt: Attempt, target: sql.Identifier, shape: Shape, mode: str) -> None:
    """Create the empty staging of ``attempt`` for the ``target`` table."""
    from psycopg import sql
    rows_table, _ = staging_ids(attempt.staging)
    if mode == PARTITION_PER_WINDOW:
        _create_partition_staging(conn, attempt, rows_table, target)
    else:
        # CREATE TABLE AS copies names and types (with typmods), no constraints:
        # staging holds what the job wrote; the target's constraints apply at commit.
        conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            rows_table, sql.SQL(", ").join(map(sql.Identifier, shape.staged)), target))
    # Each writer transaction sets eos.chunk; COPY then tags rows without
    # the writer sending a column for it. (SET DEFAULT apart from ADD
    # COLUMN, which would evaluate the default once, now.)
    conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint NOT NULL").format(
        rows_table, sql.Identifier(CHUNK_COLUMN)))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {}")
                 .format(rows_table, sql.Identifier(CHUNK_COLUMN), sql.SQL(CHUNK_DEFAULT)))
    # Dead letters are staged like the rows: unlogged, but logged where the
    # rows' staging is (partition_per_window), so a crash keeps both or neither.
    create_dead_letters(conn, attempt.staging, logged=mode == PARTITION_PER_WINDOW)


def _create_partition_staging(conn: psycopg.Connection, attempt: Attempt, rows_table: sql.Identifier,
                              target: sql.Identifier) -> None:
    """partition_per_window: the staging is the future partition. Logged (it
    must survive as the published data), with the target's columns, defaults
    and CHECK constraints (checked while staging), the window columns
    defaulting to this window, and a CHECK matching the partition bound so
    that ATTACH PARTITION need not scan it. Indexes come at the seal, once."""
    from psycopg import sql
    start, end = sql.Literal(attempt.window_start), sql.Literal(attempt.window_end)
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
                         " INCLUDING GENERATED)").format(rows_table, target))
    conn.execute(sql.SQL(
        "ALTER TABLE {table} ALTER COLUMN eos_pipeline SET DEFAULT {pipeline}::text,"
        " ALTER COLUMN eos_window_start SET DEFAULT {start}::timestamptz,"
        " ADD CONSTRAINT {bound} CHECK (eos_window_start >= {start}::timestamptz"
        " AND eos_window_start < {end}::timestamptz)").format(
            table=rows_table, pipeline=sql.Literal(attempt.pipeline), start=start, end=end,
            bound=sql.Identifier(BOUND_CONSTRAINT)))


def staged_columns(conn: psycopg.Connection, staging: str,
                   columns: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The columns the writers COPY (of ``columns``, if given), None if the
    staging is gone. (A partition_per_window staging has all the target's
    columns; the window columns, generated ones and those left to defaults are
    not written.)"""
    rows_table, _ = staging_ids(staging)
    rows = conn.execute(
        "SELECT attname, attgenerated <> '' FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
        " AND NOT attisdropped AND attname <> %s ORDER BY attnum",
        (rows_table.as_string(conn), CHUNK_COLUMN),
    ).fetchall()
    if not rows:
        return None
    return tuple(name for name, generated in rows if not generated and name not in WINDOW_COLUMNS
                 and (columns is None or name in columns))


# --------------------------------------------------------------------------- the seal (partition_per_window)


def seal(conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint, target: sql.Identifier,
         table: str) -> None:
    """In the checkpoint's transaction: make the staging hold exactly the
    checkpoint (_keep_checkpointed_chunks; a writer still copying finishes
    first), build the indexes of the ``target`` table (named ``table`` in
    messages) on it, so that the commit only attaches, and seal it: a trigger
    refuses any change from then on (a write task still running after the
    job's commit, a hand), so prepare and commit need not count it again. A
    duplicate key fails here, failing the stage with the index named, not at
    commit."""
    import psycopg
    started = time.monotonic()
    rows_table, _ = staging_ids(attempt.staging)
    try:
        unseal(conn, attempt.staging)  # a retried job commit seals again
        dropped = _keep_checkpointed_chunks(conn, attempt, checkpoint)
        built = _build_target_indexes(conn, attempt, rows_table, target, table)
        _refuse_changes(conn, attempt.staging)
    except psycopg.errors.UndefinedTable as exc:
        raise TargetError(f"staging of {attempt} does not exist: the attempt was aborted or committed") from exc
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        raise TargetError(f"cannot seal the staging of {attempt} as a partition of {table}: "
                          f"{pg_message(exc)}") from exc
    log.info("%s: staging sealed in %.2fs: %d index(es) of %s built, %d rows of chunks not in the checkpoint "
             "removed", attempt, time.monotonic() - started, built, table, dropped)


def _refuse_changes(conn: psycopg.Connection, staging: str) -> None:
    """The seal proper: from now on the staging's tables refuse every change."""
    from psycopg import sql
    for table in staging_ids(staging):
        conn.execute(sql.SQL("CREATE TRIGGER {} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {}"
                             " FOR EACH STATEMENT EXECUTE FUNCTION eos.refuse_change_to_sealed_staging()"
                             ).format(sql.Identifier(SEALED_TRIGGER), table))


def unseal(conn: psycopg.Connection, staging: str) -> None:
    from psycopg import sql
    for table in staging_ids(staging):
        conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(SEALED_TRIGGER), table))


def _keep_checkpointed_chunks(conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> int:
    """Lock the staging, delete what chunks the checkpoint does not name left
    in it (a task that staged but never reached the job commit: lost after
    its chunk committed, or a speculative copy), and check each checkpointed
    chunk holds what its task counted. Returns the rows deleted. The one
    scan of the staging in a window's life (see the target module's docstring)."""
    from psycopg import sql
    rows_table, dead_table = staging_ids(attempt.staging)
    conn.execute(sql.SQL("LOCK TABLE {}, {} IN ACCESS EXCLUSIVE MODE").format(rows_table, dead_table))
    counts = count_chunks(conn, attempt.staging)
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


def _build_target_indexes(conn: psycopg.Connection, attempt: Attempt, rows_table: sql.Identifier,
                          target: sql.Identifier, table: str) -> int:
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
        " WHERE i.indrelid = to_regclass(%s) ORDER BY i.indexrelid", (target.as_string(conn),),
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
                raise TargetError(f"cannot build index {index_def!r} of {table} on the staging")
            unique = "UNIQUE " if index_def.startswith("CREATE UNIQUE INDEX ") else ""
            statement = sql.SQL(f"CREATE {unique}INDEX {{}} ON {{}} ").format(sql.Identifier(name), rows_table)
            conn.execute(statement + sql.SQL(index_def[at + len(marker):]))
        built += 1
    return built


__all__ = ["count_chunks", "create", "drop", "seal", "staged_columns", "unseal"]
