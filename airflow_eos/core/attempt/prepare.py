"""Prepare: the barrier between an attempt's staging and its commit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from airflow_eos.core.attempt.checkpoints import load_checkpoint
from airflow_eos.core.attempt.model import COMMITTED, OPEN, PREPARED, Attempt, check_current
from airflow_eos.core.attempt.rows import load_status
from airflow_eos.core.checkpoint import Checkpoint, coverage_problems
from airflow_eos.core.errors import NotPrepared
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger

log = logging.getLogger("airflow_eos.core.attempt")


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
