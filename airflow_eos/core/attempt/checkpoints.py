"""An attempt's checkpoint in the ledger (what it consumed and the chunks it
staged, core/checkpoint.py) and the sub-ranges its job's read tasks reported."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_eos.core.attempt.model import CHECKPOINTED, OPEN, PREPARED, Attempt, check_current
from airflow_eos.core.attempt.rows import load_status
from airflow_eos.core.checkpoint import Checkpoint, ConsumedRange, StagedChunk
from airflow_eos.core.errors import AttemptClosed

if TYPE_CHECKING:  # psycopg is loaded by core.database.connect, not by importing the ledger
    import psycopg

log = logging.getLogger("airflow_eos.core.attempt")


def write_checkpoint(conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> None:
    """Record the checkpoint. Writing it again (a retried job commit) replaces
    it, until the attempt is prepared; a fenced attempt cannot checkpoint."""
    status = load_status(conn, attempt, lock=True)
    check_current(attempt, status, "checkpoint")
    if status.state == PREPARED:
        raise AttemptClosed(f"cannot checkpoint {attempt}: it is prepared already, its checkpoint is final")
    key = (attempt.pipeline, attempt.window_start, attempt.epoch)
    conn.execute("DELETE FROM eos.checkpoint_ranges WHERE pipeline = %s AND window_start = %s AND epoch = %s", key)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO eos.checkpoint_ranges (pipeline, window_start, epoch, topic, partition,"
            " start_offset, end_offset, records) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(*key, r.topic, r.partition, r.start_offset, r.end_offset, r.records) for r in checkpoint.ranges],
        )
    _replace_chunks(conn, attempt, checkpoint.chunks)
    conn.execute(
        "UPDATE eos.attempts SET state = %s, checkpointed_at = now(), row_count = %s,"
        " dead_letter_count = %s, checksum = %s WHERE pipeline = %s AND window_start = %s AND epoch = %s",
        (CHECKPOINTED, checkpoint.row_count, checkpoint.dead_letter_count, checkpoint.checksum, *key),
    )
    log.info("%s checkpointed: %d rows, %d dead letters in %d chunks; %s", attempt, checkpoint.row_count,
             checkpoint.dead_letter_count, len(checkpoint.chunks),
             ", ".join(f"{r.tp} [{r.start_offset}, {r.end_offset}) {r.records} records" for r in checkpoint.ranges))


def _replace_chunks(conn: psycopg.Connection, attempt: Attempt, chunks) -> None:
    key = (attempt.pipeline, attempt.window_start, attempt.epoch)
    conn.execute("DELETE FROM eos.checkpoint_chunks WHERE pipeline = %s AND window_start = %s AND epoch = %s", key)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO eos.checkpoint_chunks (pipeline, window_start, epoch, chunk, rows, dead_letters, checksum)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(*key, c.chunk, c.rows, c.dead_letters, c.checksum) for c in chunks],
        )


def record_staged_chunks(conn: psycopg.Connection, attempt: Attempt, chunks: tuple[StagedChunk, ...]) -> None:
    """The chunks a job commit accepted, kept for the checkpoint its driver writes
    once the job has returned (when what the job read is known only then: Spark's
    observed metrics reach the driver after the action). This is no checkpoint:
    the attempt stays open, and prepare waits while an attempt is open
    (core/attempt/prepare.py), so nothing is prepared or published from these rows
    until write_checkpoint, which replaces them, made the attempt checkpointed.
    A fenced or ended attempt cannot record them."""
    status = load_status(conn, attempt, lock=True)
    check_current(attempt, status, "stage")
    if status.state != OPEN:
        raise AttemptClosed(f"cannot record the staged chunks of {attempt}: it is {status.state} already")
    _replace_chunks(conn, attempt, chunks)


def load_checkpoint(conn: psycopg.Connection, attempt: Attempt) -> Checkpoint:
    """The attempt's checkpoint as recorded (empty if it has none)."""
    key = (attempt.pipeline, attempt.window_start, attempt.epoch)
    ranges = conn.execute(
        "SELECT topic, partition, start_offset, end_offset, records FROM eos.checkpoint_ranges"
        " WHERE pipeline = %s AND window_start = %s AND epoch = %s ORDER BY topic, partition", key,
    ).fetchall()
    chunks = conn.execute(
        "SELECT chunk, rows, dead_letters, checksum FROM eos.checkpoint_chunks"
        " WHERE pipeline = %s AND window_start = %s AND epoch = %s ORDER BY chunk", key,
    ).fetchall()
    return Checkpoint(tuple(ConsumedRange(*r) for r in ranges), tuple(StagedChunk(*c) for c in chunks))


def record_read_range(conn: psycopg.Connection, attempt: Attempt, run: str, read: ConsumedRange,
                      seconds: float) -> ConsumedRange:
    """Record that a read task of the job run ``run`` read ``read`` completely, in
    ``seconds``; return what the first report of the same sub-range (same start)
    says, which a retried or speculative read must repeat (the caller compares)."""
    end, records = conn.execute(
        "INSERT INTO eos.read_ranges (pipeline, window_start, epoch, run, topic, partition, start_offset,"
        " end_offset, records, seconds) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (pipeline, window_start, epoch, run, topic, partition, start_offset)"
        " DO UPDATE SET read_at = eos.read_ranges.read_at"  # keep the first report; return it
        " RETURNING end_offset, records",
        (attempt.pipeline, attempt.window_start, attempt.epoch, run, read.topic, read.partition, read.start_offset,
         read.end_offset, read.records, seconds),
    ).fetchone()
    return ConsumedRange(read.topic, read.partition, read.start_offset, end, records)


def load_read_ranges(conn: psycopg.Connection, attempt: Attempt, run: str) -> list[tuple[ConsumedRange, float]]:
    """The sub-ranges the read tasks of job run ``run`` reported, with their read seconds."""
    rows = conn.execute(
        "SELECT topic, partition, start_offset, end_offset, records, seconds FROM eos.read_ranges"
        " WHERE pipeline = %s AND window_start = %s AND epoch = %s AND run = %s"
        " ORDER BY topic, partition, start_offset",
        (attempt.pipeline, attempt.window_start, attempt.epoch, run),
    ).fetchall()
    return [(ConsumedRange(*r[:5]), r[5]) for r in rows]
