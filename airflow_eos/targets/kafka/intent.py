"""The Kafka target's commit intents: how a commit that died after its Kafka
transaction is told apart from one that never committed once the window's
marker is gone. A mixin of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`.

The marker (:mod:`~airflow_eos.targets.kafka.client`) lives in the committed
offsets of a consumer group no consumer joins; Kafka expires those after
``offsets.retention.minutes`` (7 days by default), and anyone may delete the
group. Without it, a commit that died between the Kafka commit and the ledger
looks like one that never committed, and the next commit would publish the
window a second time.

So before a transaction begins, its **intent** is written in the ledger
(``eos.kafka_intents``): token, ``transactional.id``, marker group, the records
it will produce and the target topic's end offsets at that moment (after
``init_transactions``: every record of the transaction lies at or after
them). It is written on a connection of its own, autocommitted: the commit's
ledger transaction commits only after Kafka, and a crash would take the intent
with it. Its resolution: ``committed`` in the ledger transaction that records
the commit; ``aborted`` when its committer aborted the transaction itself, or
when a later reader proved it aborted; null while nobody knows.

When the marker is absent (read after ``init_transactions``: no transaction
of the window is in flight), each unresolved intent of the window is
**settled** by reading the topic (``read_committed``) from its recorded ends
for a record whose ``eos-commit`` header is its token (:func:`judge`):

- found → the transaction committed: the ledger records it, as from a marker;
- not found, and the topic still holds every offset from the recorded ends
  (not compacted, log start not past them, not recreated) → it aborted: the
  commit goes on and publishes;
- an intent of zero records has nothing to find: taken as aborted. Publishing
  the window again duplicates nothing (no record), and its marker offsets are
  the window's frozen end cuts, the same whichever transaction wrote them;
- otherwise nobody can tell: :class:`~airflow_eos.core.errors.CommitOutcomeUnknown`
  (terminal), nothing published, until a person answers with
  ``airflow-eos resolve`` (:func:`answer`).
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from airflow_eos.core.database import reused
from airflow_eos.core.errors import CommitOutcomeUnknown, TargetError
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.windows import Window, to_utc
from airflow_eos.targets.kafka import client
from airflow_eos.targets.kafka.client import Marker, PartitionBounds
from airflow_eos.targets.kafka.fields import KafkaSinkFields

if TYPE_CHECKING:
    import psycopg

    from airflow_eos.core.attempt import Attempt

log = logging.getLogger(__name__)

COMMITTED = "committed"
ABORTED = "aborted"
UNKNOWN = "unknown"
# Reading the topic from an intent's ends to now: a retry days later reads days of records.
SCAN_TIMEOUT = 600.0
# How long a settle waits for the transactions open on the topic (other windows') to end.
STABLE_WAIT = client.TIMEOUT
NOTHING_TO_FIND = ("it was to produce no record: nothing can be found, and publishing the window again duplicates "
                   "nothing (its marker offsets are the window's frozen end cuts whichever transaction sends them)")


@dataclass(frozen=True)
class Intent:
    """One row of ``eos.kafka_intents``: a transaction a commit began (or was
    about to begin)."""

    pipeline: str
    window_start: datetime
    epoch: int
    token: int
    transactional_id: str
    marker_group: str
    topic_ends: Mapping[int, int]
    records: int
    created_at: datetime | None = None
    resolution: str | None = None
    resolved_how: str | None = None


@dataclass(frozen=True)
class Verdict:
    outcome: str  # COMMITTED, ABORTED or UNKNOWN
    why: str


def scan_starts(intent: Intent, bounds: Mapping[int, PartitionBounds]) -> dict[int, int]:
    """Where to read each partition of the topic from: the intent's recorded
    end (0 for a partition added since), or the log start if retention has
    passed it (what is left is still worth reading: a record found there proves
    the commit); never past the partition's end (a topic created again)."""
    return {p: min(max(intent.topic_ends.get(p, 0), b.log_start), b.end) for p, b in bounds.items()}


def judge(intent: Intent, bounds: Mapping[int, PartitionBounds], *, compacted: bool, found: bool) -> Verdict:
    """Did the intent's transaction commit? ``bounds``: the topic's partitions
    now; ``found``: a record carrying the intent's token was read from
    :func:`scan_starts` to the end (read_committed, after the window's
    producers were fenced and the topic's open transactions ended)."""
    if found:
        return Verdict(COMMITTED, f"its records (header eos-commit={intent.token}) are in the topic")
    if intent.records == 0:
        return Verdict(ABORTED, NOTHING_TO_FIND)
    problems = []
    for p in sorted(set(intent.topic_ends) | set(bounds)):
        began, now = intent.topic_ends.get(p, 0), bounds.get(p)
        if now is None:
            problems.append(f"partition {p} is gone (the topic has {len(bounds)} partition(s) now)")
        elif now.end < began:
            problems.append(f"partition {p} ends at offset {now.end}, before offset {began} where the transaction "
                            "began (the topic was deleted and created again, or lost its log)")
        elif now.log_start > began:
            problems.append(f"partition {p}'s records from offset {began} to {now.log_start - 1} were deleted (by "
                            f"retention or delete_records: its log now starts at offset {now.log_start})")
    if compacted:
        problems.append("the topic is compacted (cleanup.policy=compact): the log cleaner may have removed its "
                        "records without moving the log start")
    if problems:
        return Verdict(UNKNOWN, "; ".join(problems))
    return Verdict(ABORTED, "none of its records is in the topic, which still holds every offset from where the "
                            "transaction began")


# --------------------------------------------------------------------------- the ledger's rows

_COLUMNS = ("epoch, token, transactional_id, marker_group, topic_ends, records, created_at, resolution,"
            " resolved_how")


def record_intent(ledger_url: str, target: str, intent: Intent) -> None:
    """Write the intent on a connection of its own, committed at once and on
    disk before the Kafka transaction begins (whatever the server's
    synchronous_commit): a crash must not lose it once Kafka may commit."""
    with reused(ledger_url, "kafka commit intent", autocommit=True) as conn, conn.transaction():
        Ledger.durable_commit(conn)
        conn.execute(
            "INSERT INTO eos.kafka_intents (pipeline, window_start, target, epoch, token, transactional_id,"
            " marker_group, topic_ends, records) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (intent.pipeline, intent.window_start, target, intent.epoch, intent.token, intent.transactional_id,
             intent.marker_group, json.dumps({str(p): o for p, o in intent.topic_ends.items()}), intent.records))


def resolve_aborted(ledger_url: str, target: str, window: Window, token: int, how: str) -> None:
    """An intent's transaction aborted, for sure: a fact about Kafka, written
    at once (not undone with the commit's ledger transaction)."""
    with reused(ledger_url, "kafka commit intent", autocommit=True) as conn:
        conn.execute("UPDATE eos.kafka_intents SET resolution = 'aborted', resolved_how = %s, resolved_at = now()"
                     " WHERE pipeline = %s AND window_start = %s AND target = %s AND token = %s"
                     " AND resolution IS NULL", (how, window.pipeline, window.start, target, token))


def resolve_committed(conn: psycopg.Connection, target: str, attempt: Attempt, token: int) -> None:
    """In the ledger transaction that records the window committed with
    ``token``: its intent committed, any other left unresolved aborted (one
    transaction of a window commits; every commit settles the others first)."""
    conn.execute(
        "UPDATE eos.kafka_intents SET resolution = CASE WHEN token = %(token)s THEN 'committed' ELSE 'aborted' END,"
        " resolved_how = CASE WHEN token = %(token)s THEN coalesce(resolved_how, 'recorded by the ledger')"
        " ELSE 'another transaction of the window committed' END, resolved_at = now()"
        " WHERE pipeline = %(pipeline)s AND window_start = %(start)s AND target = %(target)s"
        " AND (resolution IS NULL OR token = %(token)s)",
        {"token": token, "pipeline": attempt.pipeline, "start": attempt.window_start, "target": target})


def pending_intents(conn: psycopg.Connection, target: str, window: Window) -> list[Intent]:
    """The window's intents nobody settled, oldest first: unresolved ones, and
    those a person answered 'committed' that the ledger has not recorded yet
    (callers ask only of windows not committed)."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM eos.kafka_intents WHERE pipeline = %s AND window_start = %s"
                        " AND target = %s AND (resolution IS NULL OR resolution = 'committed') ORDER BY created_at",
                        (window.pipeline, window.start, target)).fetchall()
    return [Intent(window.pipeline, window.start, epoch, token, tx_id, group, {int(p): o for p, o in ends.items()},
                   records, created, resolution, how)
            for epoch, token, tx_id, group, ends, records, created, resolution, how in rows]


def answer(conn: psycopg.Connection, pipeline: str, window_start: datetime, token: int, outcome: str,
           who: str) -> int:
    """A person's answer for an intent nobody can settle (``airflow-eos
    resolve``); the rows changed (0: no such unresolved intent)."""
    if outcome not in (COMMITTED, ABORTED):
        raise ValueError(f"an intent's outcome is {COMMITTED!r} or {ABORTED!r}, not {outcome!r}")
    return conn.execute("UPDATE eos.kafka_intents SET resolution = %s, resolved_how = %s, resolved_at = now()"
                        " WHERE pipeline = %s AND window_start = %s AND token = %s AND resolution IS NULL",
                        (outcome, who, pipeline, window_start, token)).rowcount


# --------------------------------------------------------------------------- the sink's side


class KafkaIntents(KafkaSinkFields):
    """Writing and settling commit intents, of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`."""

    def _open_intent(self, attempt: Attempt, token: int, records: int, partitions: int) -> None:
        """Record what the transaction about to begin will do (after
        ``init_transactions``, before ``begin_transaction``), the topic's
        ``partitions`` as the commit found them."""
        ends = client.partition_ends(self.kafka_config, self.topic, partitions)
        record_intent(self.ledger_url, self.target_id,
                      Intent(attempt.pipeline, attempt.window_start, attempt.epoch, token,
                             self.transactional_id(attempt), self.marker_group(attempt), ends, records))

    def _settle_intents(self, conn: psycopg.Connection, window: Window) -> Marker | None:
        """The marker is absent: settle the window's pending intents. Returns a
        marker for the one whose transaction committed (the caller records it
        as from the window's marker), or None when all aborted; raises
        CommitOutcomeUnknown when one cannot be told and none committed (one
        that committed settles the others: a window commits once)."""
        unknown = None
        for intent in pending_intents(conn, self.target_id, window):
            verdict = self._judge(intent)
            log.info("window %s: commit intent %d of attempt %d: %s (%s)", window, intent.token, intent.epoch,
                     verdict.outcome, verdict.why)
            if verdict.outcome == COMMITTED:  # recorded by the caller, in this transaction, with this reason
                conn.execute("UPDATE eos.kafka_intents SET resolved_how = %s WHERE pipeline = %s AND window_start = %s"
                             " AND target = %s AND token = %s",
                             (verdict.why, window.pipeline, window.start, self.target_id, intent.token))
                return Marker(intent.token, {})
            if verdict.outcome == ABORTED:
                resolve_aborted(self.ledger_url, self.target_id, window, intent.token, verdict.why)
            else:
                unknown = unknown or (intent, verdict)
        if unknown is not None:
            raise CommitOutcomeUnknown(self._unknown(window, *unknown))
        return None

    def _judge(self, intent: Intent, *, wait: float = STABLE_WAIT) -> Verdict:
        """:func:`judge` with what the topic holds now. Call after the window's
        producers were fenced (``init_transactions``); ``wait``: how long for
        the transactions open on the topic to end (see :meth:`_settled_bounds`)."""
        if intent.resolution == COMMITTED:
            return Verdict(COMMITTED, intent.resolved_how or "answered by a person")
        if intent.records == 0:
            return judge(intent, {}, compacted=False, found=False)
        bounds = self._settled_bounds(wait)
        token, pipeline = str(intent.token), intent.pipeline
        found = self.read_topic(lambda h: h.get(client.H_COMMIT) == token and h.get(client.H_PIPELINE) == pipeline,
                                timeout=SCAN_TIMEOUT, start=scan_starts(intent, bounds))
        compacted = not found and client.is_compacted(self.kafka_config, self.topic)
        return judge(intent, bounds, compacted=compacted, found=bool(found))

    def _settled_bounds(self, wait: float) -> dict[int, PartitionBounds]:
        """The topic's partitions once every transaction open on it when this
        was called has ended (the last stable offset has reached that moment's
        end): a read_committed reader then reaches past every record of the
        window's transaction, which had ended before. Other windows'
        transactions hold it for their commit's time at most."""
        partitions = client.check_topic(self.kafka_config, self.topic)
        first = client.partition_bounds(self.kafka_config, self.topic, partitions)
        deadline = time.monotonic() + wait
        now = first
        while any(now[p].stable < b.end for p, b in first.items()):
            if time.monotonic() > deadline:
                held = ", ".join(f"{p} at {now[p].stable} (end {b.end})" for p, b in first.items()
                                 if now[p].stable < b.end)
                raise TargetError(f"cannot settle a commit intent of topic {self.topic} now: a transaction open on "
                                  f"it holds read_committed readers (partitions {held}) for longer than "
                                  f"{wait:.0f}s; a retry reads again")
            time.sleep(0.5)
            now = client.partition_bounds(self.kafka_config, self.topic, partitions)
        return now

    def _unknown(self, window: Window, intent: Intent, verdict: Verdict) -> str:
        start = to_utc(window.start).isoformat()
        resolve = (f"airflow-eos resolve --pipeline {shlex.quote(window.pipeline)} --window-start {start} "
                   f"--token {intent.token}")
        return (f"window {window}: cannot tell whether the Kafka transaction of attempt {intent.epoch} committed "
                f"(commit token {intent.token}, transactional.id {intent.transactional_id}, begun at "
                f"{intent.created_at}): its commit died before the ledger heard of the outcome, the window's marker "
                f"(consumer group {intent.marker_group}) holds no offsets any more (Kafka expired them after "
                f"offsets.retention.minutes, or the group was deleted), and target topic {self.topic} cannot prove "
                f"it aborted: {verdict.why}. Nothing was published now. Find out whether the topic's readers "
                f"received {intent.records} record(s) with header eos-commit={intent.token} (a downstream copy of "
                f"the topic, a consumer's log), then tell the ledger: `{resolve} --committed` (the window's next "
                f"commit, teardown or sweep records it committed by attempt {intent.epoch}) or `{resolve} "
                "--aborted` (its next commit publishes it), and clear the window's run")
