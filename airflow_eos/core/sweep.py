"""What a target's sweep did, or would do (``airflow-eos sweep [--dry-run]``).

:meth:`Sink.sweep` aborts stale attempts, and on the way finishes windows whose
commit was decided but not completed: a file target publishes a decided window
(the rename into place), a Kafka target records a window whose transaction had
committed in Kafka (then its stale attempt is committed, not aborted). A dry run
and the real sweep report the same three lists, so that what ``--dry-run`` says
is what the sweep then does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from airflow_eos.core.attempt import ABORTED, COMMITTED, Attempt
from airflow_eos.core.sink import Sink


@dataclass(frozen=True)
class SweepReport:
    """One target's sweep: the attempts it aborted, the decided windows it
    finished (their committed attempts), and the stale attempts it left live
    (it could not abort them now; its log says why). ``dry_run``: what it
    would do."""

    target: str
    aborted: tuple[Attempt, ...] = ()
    finished: tuple[Attempt, ...] = ()
    left: tuple[Attempt, ...] = ()
    dry_run: bool = False

    @property
    def empty(self) -> bool:
        return not (self.aborted or self.finished or self.left)


def sweep_report(sink: Sink, older_than: timedelta, *, now: datetime | None = None,
                 dry_run: bool = False) -> SweepReport:
    """Sweep ``sink`` (or, ``dry_run``, only read what its sweep would do) and
    say what was done."""
    now = now or datetime.now(timezone.utc)
    stale = sink.stale_attempts(older_than, now=now)
    pending = sink.pending_publications()
    if dry_run:
        finishing = [a for a in stale if sink.sweep_finishes(a)]
        return SweepReport(sink.target_id, tuple(a for a in stale if a not in finishing),
                           tuple(pending + [a for a in finishing if a not in pending]), dry_run=True)
    aborted = sink.sweep(older_than, now=now)
    still_pending = set(sink.pending_publications())
    rest = [a for a in stale if a not in aborted]
    states = _states(sink, rest)
    finished = [a for a in pending if a not in still_pending]
    finished += [a for a in rest if states.get(a) == COMMITTED and a not in finished]
    left = [a for a in rest if states.get(a) not in (COMMITTED, ABORTED)]
    return SweepReport(sink.target_id, tuple(aborted), tuple(finished), tuple(left))


def _states(sink: Sink, attempts: list[Attempt]) -> dict[Attempt, str]:
    """The ledger's state of each attempt now."""
    if not attempts:
        return {}
    with sink.ledger.connect() as conn, conn.transaction():
        return {a: conn.execute("SELECT state FROM eos.attempts WHERE pipeline = %s AND window_start = %s"
                                " AND epoch = %s", (a.pipeline, a.window_start, a.epoch)).fetchone()[0]
                for a in attempts}
