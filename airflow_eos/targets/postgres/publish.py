"""The commit's SQL in the PostgreSQL target, per mode: what replacing a
committed window deletes (its rows, or in ``partition_per_window`` its
partition), how an attempt's rows are published (``INSERT … SELECT`` of the
checkpointed chunks, ``ON CONFLICT … DO UPDATE`` in ``upsert``, or ``ATTACH
PARTITION`` of the sealed staging), and its dead letters. Each runs inside the
commit's transaction (see :meth:`PostgresSink.publish_in_decision`), which keeps the
window's rows and the pipeline's offsets together.

Values go in as literals, not parameters: with parameters psycopg would read a
'%' inside a quoted (hostile) table name as a placeholder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, Checkpoint
from airflow_eos.core.columns import WINDOW_COLUMNS
from airflow_eos.core.errors import TargetError
from airflow_eos.targets.postgres import staging
from airflow_eos.staging.tables import CHUNK_COLUMN
from airflow_eos.targets.postgres.names import BOUND_CONSTRAINT, PARTITION_PER_WINDOW
from airflow_eos.targets.postgres.shape import Shape

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


def delete_window(conn: psycopg.Connection, attempt: Attempt, target: sql.Identifier, table: str, shape: Shape,
                  mode: str, committed_epoch: int) -> int:
    """on_committed='replace': delete what the committed attempt published of
    the window (its dead letters too). Returns the rows deleted."""
    from psycopg import sql
    conn.execute("DELETE FROM eos.dead_letters WHERE pipeline = %s AND window_start = %s",
                 (attempt.pipeline, attempt.window_start))
    if mode == PARTITION_PER_WINDOW:
        return _drop_partition(conn, attempt, table, shape, committed_epoch)
    if not shape.window_columns:  # upsert without window columns: the upsert overwrites
        return 0
    return conn.execute(  # literals, not parameters: see the module's docstring
        sql.SQL("DELETE FROM {} WHERE eos_pipeline = {}::text AND eos_window_start = {}::timestamptz").format(
            target, sql.Literal(attempt.pipeline), sql.Literal(attempt.window_start)),
    ).rowcount


def _drop_partition(conn: psycopg.Connection, attempt: Attempt, table: str, shape: Shape,
                    committed_epoch: int) -> int:
    """partition_per_window's replace: drop the partition the committed
    attempt attached (only a partition of the target by that name)."""
    from psycopg import sql
    name = attempts.staging_name(attempt.pipeline, attempt.window_start, committed_epoch)
    found = conn.execute(
        "SELECT c.oid FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s AND c.relname = %s", (shape.oid, name)).fetchone()
    if found is None:
        raise TargetError(f"cannot replace {attempt.window} in {table}: its partition {name}, attached by "
                          f"attempt {committed_epoch}, is no longer a partition of it")
    partition = sql.Identifier(shape.schema, name)
    rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(partition)).fetchone()[0]
    conn.execute(sql.SQL("DROP TABLE {}").format(partition))
    return rows


def attach(conn: psycopg.Connection, attempt: Attempt, target: sql.Identifier, shape: Shape,
           rows_table: sql.Identifier, checkpoint: Checkpoint) -> int:
    """partition_per_window's publish: the sealed staging becomes the window's
    partition, by catalog changes only (the seal built the indexes, the
    bound's CHECK spares ATTACH its scan). Returns the rows published: the
    checkpoint's, which the seal found in the staging (sealed since)."""
    from psycopg import sql
    staging.unseal(conn, attempt.staging)
    partition = sql.Identifier(shape.schema, attempt.staging)
    conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(rows_table, sql.Identifier(CHUNK_COLUMN)))
    conn.execute(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(rows_table, sql.Identifier(shape.schema)))
    conn.execute(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}::timestamptz)"
                         " TO ({}::timestamptz)").format(target, partition,
                                                         sql.Literal(attempt.window_start),
                                                         sql.Literal(attempt.window_end)))
    conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(partition, sql.Identifier(BOUND_CONSTRAINT)))
    return checkpoint.row_count


def insert_rows(target: sql.Identifier, columns: tuple[str, ...], shape: Shape, rows_table: sql.Identifier,
                values: dict[str, sql.Literal], mode: str, key: tuple[str, ...]) -> sql.Composed:
    """The statement publishing the checkpointed chunks' rows of ``columns``
    (modes replace_window and upsert). ``values``: literals of pipeline,
    window_start and chunks (the checkpointed chunk ids)."""
    from psycopg import sql
    target_columns = list(columns) + (list(WINDOW_COLUMNS) if shape.window_columns else [])
    selected = [sql.Identifier(c) for c in columns]
    if shape.window_columns:
        selected += [sql.SQL("{}::text").format(values["pipeline"]),
                     sql.SQL("{}::timestamptz").format(values["window_start"])]
    statement = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} = ANY({}::bigint[])").format(
        target, sql.SQL(", ").join(map(sql.Identifier, target_columns)), sql.SQL(", ").join(selected),
        rows_table, sql.Identifier(CHUNK_COLUMN), values["chunks"])
    if mode == "upsert":
        updated = [c for c in target_columns if c not in key] or [key[0]]
        statement += sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(
            sql.SQL(", ").join(map(sql.Identifier, key)),
            sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updated))
    return statement


def insert_dead_letters(conn: psycopg.Connection, dead_table: sql.Identifier, values: dict[str, sql.Literal]) -> int:
    """Move the checkpointed chunks' dead letters into eos.dead_letters under
    the attempt (``values``: literals of pipeline, window_start, epoch and
    chunks). Returns how many."""
    from psycopg import sql
    return conn.execute(
        sql.SQL('INSERT INTO eos.dead_letters (pipeline, window_start, epoch, topic, partition, "offset",'
                ' error, key, value) SELECT {pipeline}::text, {window_start}::timestamptz, {epoch}::int,'
                ' topic, partition, "offset", error, key, value FROM {table}'
                ' WHERE {chunk} = ANY({chunks}::bigint[])'
                ).format(table=dead_table, chunk=sql.Identifier(CHUNK_COLUMN), **values),
    ).rowcount
