"""An attempt committed: its window and itself marked committed in the
ledger, and the pipeline's offsets moved to the end of its contiguous
committed prefix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_eos.core.attempt.model import COMMITTED, PREPARED, Attempt, AttemptStatus, check_current
from airflow_eos.core.errors import NotPrepared
from airflow_eos.core.ledger import WindowState
from airflow_eos.core.windows import TopicPartition

if TYPE_CHECKING:  # psycopg is loaded by core.database.connect, not by importing the ledger
    import psycopg


def check_committable(attempt: Attempt, status: AttemptStatus) -> None:
    """Refuse to commit an attempt that is closed, fenced or not prepared."""
    check_current(attempt, status, "commit")
    if status.state != PREPARED:
        raise NotPrepared(f"cannot commit {attempt}: it is {status.state}, not prepared; "
                          "await its checkpoint first", missing=[f"attempt state is {status.state}"])


def mark_committed(conn: psycopg.Connection, attempt: Attempt, published_rows: int,
                   dead_letter_rows: int) -> dict[TopicPartition, int]:
    """Mark window and attempt committed and advance the pipeline's offsets.
    Call in the transaction that published the rows, holding load_status's locks.
    Returns the pipeline's offsets after this commit."""
    conn.execute(
        "UPDATE eos.windows SET state = %s, committed_at = now(), committed_epoch = %s,"
        " published_rows = %s, dead_letter_rows = %s WHERE pipeline = %s AND window_start = %s",
        (WindowState.COMMITTED, attempt.epoch, published_rows, dead_letter_rows, attempt.pipeline,
         attempt.window_start),
    )
    conn.execute(
        "UPDATE eos.attempts SET state = %s, ended_at = now()"
        " WHERE pipeline = %s AND window_start = %s AND epoch = %s",
        (COMMITTED, attempt.pipeline, attempt.window_start, attempt.epoch),
    )
    return advance_offsets(conn, attempt.pipeline)


def advance_offsets(conn: psycopg.Connection, pipeline: str) -> dict[TopicPartition, int]:
    """Set the pipeline's partition offsets to the end of its contiguous committed
    prefix: the windows from the earliest one, in time order, up to the first that
    is not committed (or does not start where the one before ended). Windows may
    commit out of order, like Flink committing every pending transaction up to a
    checkpoint; an offset moves only when the gap before it closes.

    The pipeline row is locked first: two commits of neighbouring windows would
    otherwise each miss the other's uncommitted window and leave a stale prefix.
    """
    conn.execute("SELECT 1 FROM eos.pipelines WHERE pipeline = %s FOR UPDATE", (pipeline,))
    rows = conn.execute(
        """
        WITH w AS (
            SELECT window_start, state, lag(window_end) OVER (ORDER BY window_start) AS previous_end
            FROM eos.windows WHERE pipeline = %(p)s
        ), stop AS (
            SELECT min(window_start) AS at FROM w WHERE state <> %(committed)s OR previous_end <> window_start
        )
        SELECT DISTINCT ON (r.topic, r.partition) r.topic, r.partition, r.end_offset
        FROM eos.window_ranges r, stop
        WHERE r.pipeline = %(p)s AND (stop.at IS NULL OR r.window_start < stop.at)
        ORDER BY r.topic, r.partition, r.window_start DESC
        """,
        {"p": pipeline, "committed": WindowState.COMMITTED},
    ).fetchall()
    offsets = {TopicPartition(t, p): o for t, p, o in rows}
    topics, partitions, values = [t for t, _, _ in rows], [p for _, p, _ in rows], [o for _, _, o in rows]
    # Exactly the prefix: a partition the prefix no longer reaches (an earlier
    # window planned late) has no committed offset.
    conn.execute(
        "DELETE FROM eos.partition_offsets WHERE pipeline = %s AND (topic, partition) NOT IN"
        " (SELECT * FROM unnest(%s::text[], %s::int[]))",
        (pipeline, topics, partitions),
    )
    conn.execute(
        'INSERT INTO eos.partition_offsets (pipeline, topic, partition, "offset")'
        " SELECT %s, * FROM unnest(%s::text[], %s::int[], %s::bigint[])"
        ' ON CONFLICT (pipeline, topic, partition) DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = now()'
        ' WHERE partition_offsets."offset" <> EXCLUDED."offset"',
        (pipeline, topics, partitions, values),
    )
    return offsets


def load_offsets(conn: psycopg.Connection, pipeline: str) -> dict[TopicPartition, int]:
    """The pipeline's committed offsets (eos.partition_offsets)."""
    rows = conn.execute('SELECT topic, partition, "offset" FROM eos.partition_offsets WHERE pipeline = %s',
                        (pipeline,)).fetchall()
    return {TopicPartition(t, p): o for t, p, o in rows}
