"""An attempt's rows in the ledger (``eos.attempts``): open one (fencing
every older attempt of its window), read its state and its window's, list the
live ones, abort one. Each function runs in the caller's transaction."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from airflow_eos.core.attempt.model import ABORTED, LIVE, LIVE_SQL, Attempt, AttemptState, AttemptStatus, staging_name
from airflow_eos.core.errors import WindowConflict, WindowNotPlanned
from airflow_eos.core.ledger import WindowState
from airflow_eos.core.windows import Window

if TYPE_CHECKING:  # psycopg is loaded by core.database.connect, not by importing the ledger
    import psycopg

log = logging.getLogger("airflow_eos.core.attempt")


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



def live_attempts(conn: psycopg.Connection, *, window: Window | None = None,
                  opened_before: datetime | None = None) -> list[Attempt]:
    """Attempts still open, checkpointed or prepared: of one window, or opened
    before an instant (for the sweep), oldest first."""
    rows = conn.execute(
        "SELECT a.pipeline, a.window_start, w.window_end, a.epoch, a.staging_table"
        " FROM eos.attempts a JOIN eos.windows w USING (pipeline, window_start)"
        f" WHERE a.state IN ({LIVE_SQL})"
        "   AND (%(p)s::text IS NULL OR (a.pipeline = %(p)s AND a.window_start = %(ws)s))"
        "   AND (%(before)s::timestamptz IS NULL OR a.opened_at < %(before)s)"
        " ORDER BY a.opened_at, a.pipeline, a.window_start, a.epoch",
        {"p": window.pipeline if window else None, "ws": window.start if window else None,
         "before": opened_before},
    ).fetchall()
    return [Attempt(*r) for r in rows]


def aborted_attempts(conn: psycopg.Connection, window: Window) -> list[Attempt]:
    """The window's attempts aborted so far (a target whose abort deletes its staging
    after marking the attempt finishes what an abort that died there left)."""
    rows = conn.execute(
        "SELECT pipeline, window_start, %s::timestamptz, epoch, staging_table FROM eos.attempts"
        " WHERE pipeline = %s AND window_start = %s AND state = %s",
        (window.end, window.pipeline, window.start, ABORTED)).fetchall()
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
        f" WHERE a.state IN ({LIVE_SQL}) AND a.opened_at < %s"
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
