"""The Kafka target's commit: the whole Kafka transaction in the commit task,
over the rows the stage made durable, then the ledger. A mixin of
:class:`~airflow_eos.targets.kafka.sink.KafkaSink`.

No Python Kafka client can prepare a transaction in one process and commit it
in another (KIP-939 is not in librdkafka), so the stage cannot leave a
transaction open for the commit: the stage makes the rows durable in the
PostgreSQL staging, and the commit task runs begin → produce → marker → commit.
The Kafka commit is the decision; the ledger follows it and is finished, from
the window's marker, by whoever comes next (a retried commit, the commit of a
rerun, the abort task, the sweep).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, AttemptStatus, Checkpoint
from airflow_eos.core.commit import Published, Settlement
from airflow_eos.core.errors import TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.windows import TopicPartition, Window
from airflow_eos.staging.tables import CHUNK_COLUMN, staging_ids
from airflow_eos.targets.kafka import client
from airflow_eos.targets.kafka.client import Marker
from airflow_eos.targets.kafka.intent import KafkaIntents, resolve_aborted, resolve_committed
from airflow_eos.targets.kafka.produce import KafkaProduce

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class KafkaTransaction:
    """What :meth:`KafkaCommit.settle` hands the publication: the window's
    producer (initialised: every other producer of the window fenced), where
    it reports failed deliveries, the topic's partition count and the
    window's end cuts (the marker's offsets)."""

    producer: Any
    failures: list[tuple]
    partitions: int
    ends: Mapping[TopicPartition, int]


class KafkaCommit(KafkaProduce, KafkaIntents):
    """The committer hooks of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`
    (the protocol is :mod:`airflow_eos.core.commit`), and finishing a window
    whose transaction committed in Kafka before the ledger was told. The
    records themselves are produced by :mod:`~airflow_eos.targets.kafka.produce`."""

    def transactional_id(self, window: Window | Attempt) -> str:
        return client.transactional_id(self.transactional_id_prefix, self.target_id, window)

    def marker_group(self, window: Window | Attempt) -> str:
        return client.marker_group(self.transactional_id_prefix, self.target_id, window)

    def settle(self, conn: psycopg.Connection, attempt: Attempt) -> Settlement:
        """Before the decision, holding the window's lock (the protocol is
        :mod:`airflow_eos.core.commit`):

        1. ``init_transactions`` with the window's ``transactional.id``: every
           other producer of the window (a committer that lost its ledger
           connection, a zombie) is fenced, and its open transaction aborted
           (at once, not after the broker's transaction timeout).
        2. The window's marker (read only now, when no transaction of the
           window is in flight): present → a transaction of the window
           committed but the ledger was not told (a crash after the Kafka
           commit); the ledger records it (the protocol then reports
           ALREADY_COMMITTED if it was this attempt's, else SKIPPED). Absent
           (Kafka may have expired it) → the window's unsettled commit intents
           are settled from the topic (:mod:`~airflow_eos.targets.kafka.intent`):
           one that committed is recorded as from the marker; one nobody can
           tell stops the commit.

        Otherwise the initialised producer is what :meth:`publish_in_decision`
        publishes with."""
        ends = self._window_ends(conn, attempt.window)
        partitions = client.check_topic(self.kafka_config, self.topic)
        failures: list[tuple] = []
        producer = self._init_producer(attempt, failures)
        found = self._committed_in_kafka(conn, attempt.window, ends)
        if found is not None:
            committed, marker = found
            log.info("%s: the window's transaction committed in Kafka by attempt %d (commit %d); the ledger is "
                     "told now", attempt, committed.epoch, marker.token)
            return Settlement(recorded=True)
        return Settlement(publishing=KafkaTransaction(producer, failures, partitions, ends))

    def commit_problems(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        """The staging counted chunk by chunk against the checkpoint."""
        return self.staging_problems(attempt, checkpoint)

    def publish_in_decision(self, conn: psycopg.Connection, attempt: Attempt, checkpoint: Checkpoint,
                            replacing: AttemptStatus | None, settlement: Settlement) -> Published:
        """The whole Kafka transaction, in the decision's ledger transaction:
        the attempt's intent is written (autocommitted), then one transaction
        produces the checkpointed rows (key, value, headers, lineage headers
        with the commit token), sends the marker offsets, commits. A record
        too large, the topic missing, a fenced producer: the transaction is
        aborted, nothing is published, a clear error. Then the ledger's side:
        the commit token in ``eos.kafka_commits``, the dead letters."""
        transaction: KafkaTransaction = settlement.publishing
        token = client.new_token(attempt.epoch)
        self._open_intent(attempt, token, checkpoint.row_count, transaction.partitions)
        produced = self._produce(conn, transaction.producer, transaction.failures, attempt, token,
                                 [c.chunk for c in checkpoint.chunks], transaction.ends, checkpoint.row_count)
        fault_point("commit.after_kafka_commit")
        dead = self._record_kafka_commit(conn, attempt, token, produced)
        return Published(checkpoint.row_count, dead)

    def discard(self, attempt: Attempt, conn: psycopg.Connection | None = None) -> None:
        """Drop the attempt's staging tables, in the transaction that ends the attempt."""
        self._drop_staging(conn, attempt)

    # ------------------------------------------------------------------ the ledger

    def _record_kafka_commit(self, conn: psycopg.Connection, attempt: Attempt, token: int,
                             produced: int | None) -> int:
        """The ledger's record of ``attempt``'s transaction, which committed in
        Kafka with ``token``: its dead letters, its intent settled, the commit
        in ``eos.kafka_commits``. Returns the dead letters. In the transaction
        holding the window's lock, which then marks the window committed."""
        from psycopg import sql
        _, dead_table = staging_ids(attempt.staging)
        dead = 0
        if self._staging_exists(conn, attempt):
            checkpoint = attempts.load_checkpoint(conn, attempt)
            dead = conn.execute(sql.SQL(
                'INSERT INTO eos.dead_letters (pipeline, window_start, epoch, topic, partition, "offset", error, key,'
                ' value) SELECT %s, %s, %s, topic, partition, "offset", error, key, value FROM {} WHERE {} = ANY(%s)'
            ).format(dead_table, sql.Identifier(CHUNK_COLUMN)),
                (attempt.pipeline, attempt.window_start, attempt.epoch,
                 [c.chunk for c in checkpoint.chunks])).rowcount
        else:
            log.warning("%s: its staging is gone; its dead letters cannot be recorded", attempt)
        resolve_committed(conn, self.target_id, attempt, token)
        conn.execute(
            "INSERT INTO eos.kafka_commits (pipeline, window_start, target, epoch, token, transactional_id,"
            " marker_group, records) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (attempt.pipeline, attempt.window_start, self.target_id, attempt.epoch, token,
             self.transactional_id(attempt), self.marker_group(attempt), produced))
        return dead

    def _window_ends(self, conn: psycopg.Connection, window: Window) -> dict[TopicPartition, int]:
        """The window's end cuts, from its frozen plan: the offsets its marker holds."""
        plan = self.ledger.load_plan(conn, window)
        return {r.tp: r.end_offset for r in plan.ranges} if plan else {}

    def _committed_in_kafka(self, conn: psycopg.Connection, window: Window,
                            ends: Mapping[TopicPartition, int]) -> tuple[Attempt, Marker] | None:
        """After the window's producers were fenced: the attempt whose
        transaction committed in Kafka, told by the window's marker or, the
        marker absent, by settling the window's commit intents, recorded in
        the ledger now (with the marker); None if none committed."""
        marker = client.read_marker(self.kafka_config, self.marker_group(window), self.topic, ends) \
            or self._settle_intents(conn, window)
        if marker is None:
            return None
        return self._record_marker(conn, window, marker), marker

    def _record_marker(self, conn: psycopg.Connection, window: Window, marker: Marker) -> Attempt:
        """The ledger told of a transaction the marker says committed (its
        attempt may since have been fenced, or aborted by a teardown that ran
        before this finish: it is committed all the same, as Kafka says)."""
        row = conn.execute(
            "SELECT pipeline, window_start, %s::timestamptz, epoch, staging_table FROM eos.attempts"
            " WHERE pipeline = %s AND window_start = %s AND epoch = %s",
            (window.end, window.pipeline, window.start, marker.epoch)).fetchone()
        if row is None:
            raise TargetError(f"window {window}: the marker of topic {self.topic} says attempt {marker.epoch} "
                              "committed it, but the ledger has no such attempt (another ledger publishes this "
                              "pipeline into the topic?); nothing recorded")
        committed = Attempt(*row)
        checkpoint = attempts.load_checkpoint(conn, committed)
        dead = self._record_kafka_commit(conn, committed, marker.token, None)
        attempts.mark_committed(conn, committed, checkpoint.row_count, dead)
        self.discard(committed, conn)
        return committed

    # ------------------------------------------------------------------ the Kafka transaction

    def _init_producer(self, window: Window | Attempt, failures: list[tuple] | None = None):
        """The window's transactional producer, initialised (every other
        producer of the window fenced). Failed deliveries go into
        ``failures`` as (error, key, value): one producer-wide callback
        called only for failures, not a callback per record (a quarter of
        the produce loop's time)."""
        from confluent_kafka import KafkaException
        tx_id = self.transactional_id(window)
        reports = {}
        if failures is not None:
            def failed(err, msg) -> None:
                if err is not None and len(failures) < 5:
                    failures.append((err.str(), msg.key(), msg.value()))
            reports = {"on_delivery": failed, "delivery.report.only.error": True}
        producer = client.producer(self.kafka_config, tx_id, {**self.producer_config, **reports})
        try:
            producer.init_transactions(client.TIMEOUT)
        except KafkaException as exc:
            raise TargetError(f"cannot start the transactional producer {tx_id} of topic {self.topic}: "
                              f"{exc.args[0]}") from exc
        return producer

    def _produce(self, conn: psycopg.Connection, producer, failures: list[tuple], attempt: Attempt, token: int,
                 chunks: list[int], ends: Mapping[TopicPartition, int], rows: int | None) -> int:
        """One Kafka transaction: every checkpointed staged row (``rows``, as
        the checkpoint counted them and the commit's check found them) as a
        record, then the marker offsets; commit. Returns the records produced.
        Aborts the transaction (and raises) on any error."""
        if rows is None:  # a checkpoint without a row count: count them
            rows = self._count_rows(conn, staging_ids(attempt.staging)[0], chunks)
        midpoint = max(1, rows // 2)
        producer.begin_transaction()
        try:
            fault_point("commit.before_publish")
            produced = self._send_rows(conn, producer, failures, attempt, token, chunks, midpoint)
            self._check_delivered(conn, producer, failures, attempt, chunks)
            fault_point("commit.after_publish")
            self._send_marker(producer, attempt, token, ends)
        except BaseException:
            self._abort_transaction(producer, attempt, token)
            raise
        self._commit_transaction(producer, attempt, token)
        log.info("%s: %d record(s) published into topic %s in transaction %s (commit %d)", attempt, produced,
                 self.topic, self.transactional_id(attempt), token)
        return produced

    @staticmethod
    def _mid_produce(producer) -> None:
        """Half the window's records sent (see KafkaProduce._send_rows): flushed,
        then the fault point ``commit.mid_produce`` (the commit's fault points
        are all in this module)."""
        producer.flush(client.TIMEOUT)
        fault_point("commit.mid_produce")

    def _send_marker(self, producer, attempt: Attempt, token: int, ends: Mapping[TopicPartition, int]) -> None:
        """The window's marker, in the transaction: its end cuts and commit
        token as offsets of the window's marker group."""
        from confluent_kafka import Consumer
        consumer = Consumer({**client._client(self.kafka_config), "group.id": self.marker_group(attempt),
                             "enable.auto.commit": False})
        try:
            producer.send_offsets_to_transaction(client.marker_offsets(self.topic, token, ends),
                                                 consumer.consumer_group_metadata(), client.TIMEOUT)
        finally:
            consumer.close()

    def _commit_transaction(self, producer, attempt: Attempt, token: int) -> None:
        from confluent_kafka import KafkaException
        try:
            producer.commit_transaction(client.TIMEOUT)
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                self._abort_transaction(producer, attempt, token)
            raise TargetError(f"the transaction of {attempt} into topic {self.topic} did not commit: {error.str()} "
                              "(fenced by another committer of the window, or the broker refused it); a retry tells "
                              "from the window's marker whether it committed") from exc

    def _abort_transaction(self, producer, attempt: Attempt, token: int) -> None:
        """Abort the transaction; once Kafka confirmed it, its intent is
        settled (aborted) at once, sparing the next commit a read of the topic."""
        try:
            producer.abort_transaction(client.TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - the next init_transactions of the window aborts it anyway
            log.warning("%s: could not abort its Kafka transaction (%s); the next commit, abort or sweep of the "
                        "window aborts it", attempt, exc)
            return
        try:
            resolve_aborted(self.ledger_url, self.target_id, attempt.window, token, "aborted by its committer")
        except Exception as exc:  # noqa: BLE001 - left unresolved, the next commit settles it from the topic
            log.warning("%s: its transaction aborted, but the ledger could not be told (%s)", attempt, exc)


