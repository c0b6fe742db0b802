"""Steps 2–5 of a window's life as far as they do not depend on the target:
open an attempt (fencing every older one), record its checkpoint, prove it
complete (prepare), mark it committed with the pipeline's offsets, or abort it.

An *attempt* is one execution of the stage step for a window. Opening one bumps
the window's epoch; only the attempt holding the current epoch can be
checkpointed, prepared or committed, like a Kafka producer epoch fencing zombie
producers. An older attempt may still be writing its staging (a zombie Spark job),
which is harmless: its rows are never published.

What an attempt staged is its *checkpoint* (core/checkpoint.py: what it
consumed, the chunks it staged), written here once its job committed and proved
against the plan and the staging by prepare.

The functions that take a connection run inside the caller's transaction, so
that a target sharing the ledger's database (PostgresTarget) can make each step
and its own staging work one atomic change.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING

from airflow_eos.core.checkpoint import Checkpoint, ConsumedRange, StagedChunk, coverage_problems
# The rest of the checkpoint, imported from here before it had a module of its own.
from airflow_eos.core.checkpoint import chunk_problems, combine_checksums, make_checkpoint  # noqa: F401
from airflow_eos.core.errors import (
    AttemptClosed,
    AttemptFenced,
    NotPrepared,
    WindowConflict,
    WindowNotPlanned,
)
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger, WindowState
from airflow_eos.core.windows import TopicPartition, Window, to_utc

if TYPE_CHECKING:  # psycopg is loaded by core.database.connect, not by importing the ledger
    import psycopg

log = logging.getLogger(__name__)


class AttemptState(str, Enum):
    """An attempt's state, stored in ``eos.attempts.state`` as its value (a
    member is a str, so psycopg binds it as that text and it equals it)."""

    OPEN = "open"
    CHECKPOINTED = "checkpointed"
    PREPARED = "prepared"
    COMMITTED = "committed"
    ABORTED = "aborted"

    def __str__(self) -> str:  # the value in messages and f-strings, not "AttemptState.OPEN"
        return self.value


OPEN = AttemptState.OPEN
CHECKPOINTED = AttemptState.CHECKPOINTED
PREPARED = AttemptState.PREPARED
COMMITTED = AttemptState.COMMITTED
ABORTED = AttemptState.ABORTED
LIVE = (OPEN, CHECKPOINTED, PREPARED)  # may still be aborted (or swept)
# LIVE as SQL literals: a query with this predicate can use the partial index attempts_open
_LIVE_SQL = ", ".join(f"'{s.value}'" for s in LIVE)


# --------------------------------------------------------------------------- attempts


@dataclass(frozen=True)
class Attempt:
    """One execution of a window's stage step. Plain data: picklable for Spark,
    ``to_dict`` for XCom."""

    pipeline: str
    window_start: datetime
    window_end: datetime
    epoch: int
    staging: str  # the staging's name in the target's namespace (see staging_name)

    @property
    def window(self) -> Window:
        return Window(self.pipeline, self.window_start, self.window_end)

    def __str__(self) -> str:
        return f"{self.window} attempt {self.epoch}"

    def to_dict(self) -> dict:
        return {"pipeline": self.pipeline, "window_start": self.window_start.isoformat(),
                "window_end": self.window_end.isoformat(), "epoch": self.epoch, "staging": self.staging}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Attempt":
        return cls(data["pipeline"], to_utc(data["window_start"]), to_utc(data["window_end"]),
                   int(data["epoch"]), data["staging"])


def staging_name(pipeline: str, window_start: datetime, epoch: int) -> str:
    """A name for an attempt's staging that is safe in any namespace (lowercase
    letters, digits, underscores; at most 56 characters, leaving room for a
    suffix within PostgreSQL's 63) and readable to a person looking for it.

    The pipeline name reaches it only as a hash plus a sanitised prefix, so a
    hostile pipeline name can never shape SQL or a path.
    """
    digest = hashlib.sha256(f"{pipeline}\0{to_utc(window_start).isoformat()}".encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "_", pipeline.lower()).strip("_")[:20] or "p"
    return f"{slug}_{to_utc(window_start):%Y%m%d%H%M}_{digest}_e{epoch}"


def open_attempt(conn: psycopg.Connection, window: Window) -> Attempt:
    """Open a new attempt with the window's next epoch, fencing every older one.

    Locks the window row, so it waits for a commit of the same window in flight
    and a commit that follows sees the new epoch.
    """
    row = conn.execute(
        "SELECT window_end FROM eos.windows WHERE pipeline = %s AND window_start = %s FOR UPDATE",
        (window.pipeline, window.start),
    ).fetchone()
    if row is None:
        raise WindowNotPlanned(f"window {window} has no frozen plan: plan it before staging it")
    if row[0] != window.end:
        raise WindowConflict(f"window {window} was planned with end {row[0].isoformat()}")
    (epoch,) = conn.execute(
        "UPDATE eos.windows SET epoch = epoch + 1 WHERE pipeline = %s AND window_start = %s RETURNING epoch",
        (window.pipeline, window.start),
    ).fetchone()
    staging = staging_name(window.pipeline, window.start, epoch)
    attempt = Attempt(window.pipeline, window.start, window.end, epoch, staging)
    conn.execute(
        "INSERT INTO eos.attempts (pipeline, window_start, epoch, staging_table) VALUES (%s, %s, %s, %s)",
        (attempt.pipeline, attempt.window_start, attempt.epoch, attempt.staging),
    )
    log.info("%s opened; older attempts of the window are fenced", attempt)
    return attempt


@dataclass(frozen=True)
class AttemptStatus:
    """An attempt's row and its window's, read together."""

    epoch: int
    state: AttemptState
    reason: str | None
    row_count: int | None
    dead_letter_count: int | None
    window_state: WindowState
    window_epoch: int
    committed_epoch: int | None
    published_rows: int | None
    dead_letter_rows: int | None

    @property
    def fenced(self) -> bool:
        return self.epoch < self.window_epoch


def load_status(conn: psycopg.Connection, attempt: Attempt, *, lock: bool = False) -> AttemptStatus:
    """The attempt's state and its window's. With ``lock``, the window row and
    then the attempt row are locked for update (always in that order), which
    serialises commits, begins and aborts of the window."""
    suffix = " FOR UPDATE" if lock else ""
    window = conn.execute(
        "SELECT state, epoch, committed_epoch, published_rows, dead_letter_rows FROM eos.windows"
        " WHERE pipeline = %s AND window_start = %s" + suffix,
        (attempt.pipeline, attempt.window_start),
    ).fetchone()
    row = conn.execute(
        "SELECT state, reason, row_count, dead_letter_count FROM eos.attempts"
        " WHERE pipeline = %s AND window_start = %s AND epoch = %s" + suffix,
        (attempt.pipeline, attempt.window_start, attempt.epoch),
    ).fetchone()
    if window is None or row is None:
        raise WindowNotPlanned(f"{attempt} is not in the ledger of this database")
    state, *attempt_rest = row
    window_state, *window_rest = window
    return AttemptStatus(attempt.epoch, AttemptState(state), *attempt_rest, WindowState(window_state), *window_rest)


def load_state(conn: psycopg.Connection, attempt: Attempt) -> AttemptState | None:
    """The attempt's state, None if the ledger has no such attempt."""
    row = conn.execute("SELECT state FROM eos.attempts WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                       (attempt.pipeline, attempt.window_start, attempt.epoch)).fetchone()
    return None if row is None else AttemptState(row[0])


def check_current(attempt: Attempt, status: AttemptStatus, doing: str) -> None:
    """Refuse to move an attempt that is closed or fenced."""
    if status.state in (COMMITTED, ABORTED):
        raise AttemptClosed(f"cannot {doing} {attempt}: it was {status.state}"
                            + (f" ({status.reason})" if status.reason else ""))
    if status.fenced:
        raise AttemptFenced(
            f"cannot {doing} {attempt}: attempt {status.window_epoch} of the window was opened after it, "
            "so it is fenced (a rerun or a zombie); only the newest attempt can be prepared or committed"
        )


def live_attempts(conn: psycopg.Connection, *, window: Window | None = None,
                  opened_before: datetime | None = None) -> list[Attempt]:
    """Attempts still open, checkpointed or prepared: of one window, or opened
    before an instant (for the sweep), oldest first."""
    rows = conn.execute(
        "SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table"
        " FROM eos.attempts a JOIN eos.windows w USING (pipeline, window_start)"
        f" WHERE a.state IN ({_LIVE_SQL})"
        "   AND (%(p)s::text IS NULL OR (a.pipeline = %(p)s AND a.window_start = %(ws)s))"
        "   AND (%(before)s::timestamptz IS NULL OR a.opened_at < %(before)s)"
        " ORDER BY a.opened_at, a.pipeline, a.window_start, a.epoch",
        {"p": window.pipeline if window else None, "ws": window.start if window else None,
         "before": opened_before},
    ).fetchall()
    return [Attempt(*r) for r in rows]


def stale_attempts(conn: psycopg.Connection, opened_before: datetime, *,
                   claims: bool = True) -> list[tuple[Attempt, str | None]]:
    """Live attempts opened before an instant (the sweep's), oldest first, each
    with the target its pipeline is claimed for (``eos.pipelines.target``), or
    None: a pipeline with no claim, or one claimed without a target (planned by
    a version before claims, or by a plan that named no target). ``claims``:
    the ledger's schema records claims (``Ledger.records_claims``); without
    them every attempt's target is None."""
    target = "p.target" if claims else "NULL::text"
    rows = conn.execute(
        f"SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table, {target}"
        " FROM eos.attempts a JOIN eos.windows w USING (pipeline, window_start)"
        " JOIN eos.pipelines p ON p.pipeline = a.pipeline"
        f" WHERE a.state IN ({_LIVE_SQL}) AND a.opened_at < %s"
        " ORDER BY a.opened_at, a.pipeline, a.window_start, a.epoch",
        (opened_before,),
    ).fetchall()
    return [(Attempt(*r[:5]), r[5]) for r in rows]


def attempt_counts(conn: psycopg.Connection, pipeline: str) -> dict[datetime, dict[AttemptState, int]]:
    """How many attempts of each window of the pipeline are in each state."""
    counts: dict[datetime, dict[AttemptState, int]] = {}
    for window_start, state, n in conn.execute(
            "SELECT window_start, state, count(*) FROM eos.attempts WHERE pipeline = %s GROUP BY 1, 2", (pipeline,)):
        counts.setdefault(window_start, {})[AttemptState(state)] = n
    return counts


# --------------------------------------------------------------------------- checkpoint


def write_checkpoint(conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> None:
    """Record the checkpoint. Writing it again (a retried job commit) replaces
    it, until the attempt is prepared; a fenced attempt cannot checkpoint."""
    status = load_status(conn, attempt, lock=True)
    check_current(attempt, status, "checkpoint")
    if status.state == PREPARED:
        raise AttemptClosed(f"cannot checkpoint {attempt}: it is prepared already, its checkpoint is final")
    key = (attempt.pipeline, attempt.window_start, attempt.epoch)
    conn.execute("DELETE FROM eos.checkpoint_ranges WHERE pipeline = %s AND window_start = %s AND epoch = %s", key)
    conn.execute("DELETE FROM eos.checkpoint_chunks WHERE pipeline = %s AND window_start = %s AND epoch = %s", key)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO eos.checkpoint_ranges (pipeline, window_start, epoch, topic, partition,"
            " start_offset, end_offset, records) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(*key, r.topic, r.partition, r.start_offset, r.end_offset, r.records) for r in checkpoint.ranges],
        )
        cur.executemany(
            "INSERT INTO eos.checkpoint_chunks (pipeline, window_start, epoch, chunk, rows, dead_letters, checksum)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(*key, c.chunk, c.rows, c.dead_letters, c.checksum) for c in checkpoint.chunks],
        )
    conn.execute(
        "UPDATE eos.attempts SET state = %s, checkpointed_at = now(), row_count = %s,"
        " dead_letter_count = %s, checksum = %s WHERE pipeline = %s AND window_start = %s AND epoch = %s",
        (CHECKPOINTED, checkpoint.row_count, checkpoint.dead_letter_count, checkpoint.checksum, *key),
    )
    log.info("%s checkpointed: %d rows, %d dead letters in %d chunks; %s", attempt, checkpoint.row_count,
             checkpoint.dead_letter_count, len(checkpoint.chunks),
             ", ".join(f"{r.tp} [{r.start_offset}, {r.end_offset}) {r.records} records" for r in checkpoint.ranges))


def load_checkpoint(conn: psycopg.Connection, attempt: Attempt) -> Checkpoint:
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


# --------------------------------------------------------------------------- prepare


@dataclass(frozen=True)
class Readiness:
    """Prepare's answer: ``prepared``, or what it is still waiting for."""

    prepared: bool
    detail: str

    def __bool__(self) -> bool:
        return self.prepared


def prepare(ledger: Ledger, attempt: Attempt,
            staging_problems: Callable[[Attempt, Checkpoint], list[str]]) -> Readiness:
    """The barrier (await_checkpoint). Not ready while the checkpoint is not
    written; prepared once the checkpoint covers the plan, the staging holds
    exactly what it counted and the attempt holds the current epoch.

    ``staging_problems(attempt, checkpoint)`` says where the staging differs
    from the checkpoint (the sink's check; see Sink.staging_problems). Raises
    NotPrepared (with every problem), AttemptFenced or AttemptClosed when
    waiting cannot help.
    """
    fault_point("checkpoint.before_prepare")
    with ledger.connect() as conn:
        with conn.transaction():
            status = load_status(conn, attempt)
            if status.state == COMMITTED:
                return Readiness(True, f"{attempt} is committed already")
            check_current(attempt, status, "prepare")
            if status.state == OPEN:
                return Readiness(False, f"{attempt} has no checkpoint yet: its Spark job has not committed")
            plan = ledger.load_plan(conn, attempt.window)
            checkpoint = load_checkpoint(conn, attempt)
        problems = coverage_problems(plan.ranges, checkpoint.ranges)
        problems += staging_problems(attempt, checkpoint)
        if problems:
            raise NotPrepared(f"{attempt} cannot be prepared:\n  " + "\n  ".join(problems), missing=problems)
        with conn.transaction():
            status = load_status(conn, attempt, lock=True)  # an abort or a newer attempt may have come meanwhile
            check_current(attempt, status, "prepare")
            conn.execute(
                "UPDATE eos.attempts SET state = %s, prepared_at = coalesce(prepared_at, now())"
                " WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                (PREPARED, attempt.pipeline, attempt.window_start, attempt.epoch),
            )
    detail = (f"{attempt} prepared: {checkpoint.row_count} rows and {checkpoint.dead_letter_count} dead letters "
              f"staged, {len(checkpoint.ranges)} partition(s) consumed to their end cuts")
    log.info(detail)
    return Readiness(True, detail)


# --------------------------------------------------------------------------- commit


def check_committable(attempt: Attempt, status: AttemptStatus) -> None:
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
    rows = conn.execute('SELECT topic, partition, "offset" FROM eos.partition_offsets WHERE pipeline = %s',
                        (pipeline,)).fetchall()
    return {TopicPartition(t, p): o for t, p, o in rows}


# --------------------------------------------------------------------------- abort


def mark_aborted(conn: psycopg.Connection, attempt: Attempt, reason: str) -> bool:
    """Mark a live attempt aborted; False if it had ended already (committed or
    aborted). Locks only the attempt row, so aborting waits for a commit of this
    attempt in flight but never blocks on other attempts of the window."""
    row = conn.execute(
        "SELECT state FROM eos.attempts WHERE pipeline = %s AND window_start = %s AND epoch = %s FOR UPDATE",
        (attempt.pipeline, attempt.window_start, attempt.epoch),
    ).fetchone()
    if row is None or row[0] not in LIVE:
        return False
    conn.execute(
        "UPDATE eos.attempts SET state = %s, ended_at = now(), reason = %s"
        " WHERE pipeline = %s AND window_start = %s AND epoch = %s",
        (ABORTED, reason, attempt.pipeline, attempt.window_start, attempt.epoch),
    )
    log.info("%s aborted: %s", attempt, reason)
    return True
