"""The Kafka target's abort, teardown and sweep. A mixin of
:class:`~airflow_eos.targets.kafka.sink.KafkaSink`.

The Kafka commit is the decision and the ledger follows it, so before an
attempt that may have reached Kafka (a prepared one) is aborted, the window is
*finished* (:meth:`KafkaAbort.finish`): its producers are fenced (which also
ends a transaction a dead committer left open, which otherwise holds every
``read_committed`` reader of the partition until the broker times it out) and
its marker read; a transaction that committed is recorded in the ledger, never
aborted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import PREPARED, Attempt
from airflow_eos.core.errors import EosError
from airflow_eos.core.ledger import WindowState
from airflow_eos.core.windows import Window
from airflow_eos.targets.kafka import client
from airflow_eos.targets.kafka.fields import KafkaSinkFields
from airflow_eos.targets.kafka.intent import COMMITTED, pending_intents

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)


class KafkaAbort(KafkaSinkFields):
    """What the abort, the teardown and the sweep of
    :class:`~airflow_eos.targets.kafka.sink.KafkaSink` do before aborting
    (ahead of :class:`~airflow_eos.core.sink.Sink` in its bases)."""

    def settle_before_abort(self, conn: psycopg.Connection, attempt: Attempt) -> None:
        """In the abort's ledger transaction (the protocol is
        :func:`airflow_eos.core.commit.abort`): a prepared attempt's window is
        finished first (its transaction may have committed in Kafka); a
        committed attempt is then left alone by the abort.

        The window's lock before the attempt's state: a commit holds it from
        its checks to its ledger record, so no commit runs while this reads; a
        commit that reached Kafka and died left its attempt prepared, and an
        attempt read otherwise never reached Kafka (read without the lock, a
        commit could prepare, commit in Kafka and die between the read and the
        abort, whose dropped staging would lose the window's dead letters)."""
        conn.execute("SELECT 1 FROM eos.windows WHERE pipeline = %s AND window_start = %s FOR UPDATE",
                     (attempt.pipeline, attempt.window_start))
        if attempts.load_state(conn, attempt) == PREPARED:
            self.finish_locked(conn, attempt.window)

    def finish(self, window: Window) -> Attempt | None:
        """Tell the ledger of a transaction of the window that committed in
        Kafka after which the commit died (the abort task and the sweep call
        this before aborting): fences the window's producers, reads the
        marker, or without it settles the window's commit intents. Returns
        the attempt recorded as committed, or None."""
        with self.ledger.connect() as conn, conn.transaction():
            return self.finish_locked(conn, window)

    def finish_locked(self, conn: psycopg.Connection, window: Window) -> Attempt | None:
        """:meth:`finish` in the caller's ledger transaction (which then holds
        the window's row lock, as a commit does)."""
        row = conn.execute("SELECT state FROM eos.windows WHERE pipeline = %s AND window_start = %s FOR UPDATE",
                           (window.pipeline, window.start)).fetchone()
        if row is None or row[0] == WindowState.COMMITTED:
            return None
        ends = self._window_ends(conn, window)
        producer = self._init_producer(window)
        del producer
        found = self._committed_in_kafka(conn, window, ends)
        if found is None:
            return None
        committed, _ = found
        log.info("%s: its transaction had committed in Kafka; the ledger is told now", committed)
        return committed

    def abort_window(self, window: Window, reason: str) -> list[Attempt]:
        """The teardown: finish the window (fence its producers, ending any
        transaction left open; record a transaction that committed), then
        abort its live attempts."""
        self.finish(window)
        return super().abort_window(window, reason)

    def sweep_finishes(self, attempt: Attempt) -> bool:
        """Would the sweep record this stale attempt as committed? Yes if it is
        prepared (its commit may have reached Kafka) and the window's marker
        names its epoch (or, the marker gone, the window's commit intent of
        its epoch is found in the topic). Read without fencing the window's
        producers (a dry run changes nothing): a transaction still in flight
        is not seen."""
        with self.ledger.connect() as conn, conn.transaction():
            prepared = attempts.load_state(conn, attempt) == PREPARED
            plan = self.ledger.load_plan(conn, attempt.window) if prepared else None
        if plan is None:
            return False
        ends = {r.tp: r.end_offset for r in plan.ranges}
        marker = client.read_marker(self.kafka_config, self.marker_group(attempt), self.topic, ends)
        if marker is not None:
            return marker.epoch == attempt.epoch
        # no marker (expired?): what settling the window's intents would find
        with self.ledger.connect() as conn:
            pending = pending_intents(conn, self.target_id, attempt.window)
        try:
            return any(i.epoch == attempt.epoch and self._judge(i, wait=0).outcome == COMMITTED for i in pending)
        except EosError as exc:  # e.g. a transaction left open holds the topic: the sweep itself fences it first
            log.info("%s: its commit intent cannot be settled without fencing the window (%s)", attempt, exc)
            return False
