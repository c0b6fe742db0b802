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
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import COMMITTED, Attempt, AttemptStatus
from airflow_eos.core.columns import LINEAGE_COLUMNS
from airflow_eos.core.errors import NotPrepared, TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED, SKIPPED, CommitResult
from airflow_eos.core.windows import TopicPartition, Window, to_utc
from airflow_eos.targets.kafka import client
from airflow_eos.targets.kafka.client import Marker
from airflow_eos.targets.kafka.intent import KafkaIntents, resolve_aborted, resolve_committed
from airflow_eos.staging.tables import CHUNK_COLUMN, staging_ids

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

FETCH_ROWS = 10_000


class KafkaCommit(KafkaIntents):
    """commit and the ledger's side of it, of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`."""

    def transactional_id(self, window: Window | Attempt) -> str:
        return client.transactional_id(self.transactional_id_prefix, self.target_id, window)

    def marker_group(self, window: Window | Attempt) -> str:
        return client.marker_group(self.transactional_id_prefix, self.target_id, window)

    def commit(self, attempt: Attempt) -> CommitResult:
        """Commit a prepared attempt, in one ledger transaction that holds the
        window's row lock throughout (commits of a window run one at a time):

        1. The ledger says this attempt committed → ALREADY_COMMITTED; another
           attempt → SKIPPED (``on_committed="skip"``; this one is aborted).
        2. ``init_transactions`` with the window's ``transactional.id``: every
           other producer of the window (a committer that lost its ledger
           connection, a zombie) is fenced, and its open transaction aborted
           (at once, not after the broker's transaction timeout).
        3. The window's marker (read only now, when no transaction of the
           window is in flight): present → a transaction of the window
           committed but the ledger was not told (a crash after the Kafka
           commit); the ledger records it (ALREADY_COMMITTED if it was this
           attempt's, else SKIPPED). Absent (Kafka may have expired it) → the
           window's unsettled commit intents are settled from the topic
           (:mod:`~airflow_eos.targets.kafka.intent`): one that committed is
           recorded as from the marker; one nobody can tell stops the commit.
        4. Else: the attempt must be prepared and current, its staging as
           checkpointed; its intent is written (autocommitted), then one
           transaction produces the checkpointed rows (key,
           value, headers, lineage headers with the commit token), sends the
           marker offsets, commits. A record too large, the topic missing, a
           fenced producer: the transaction is aborted, nothing is published,
           a clear error.
        5. The ledger: window committed (epoch, counts, offsets), the commit
           token in ``eos.kafka_commits``, dead letters, staging dropped.
        """
        started = time.monotonic()
        with self.ledger.connect() as conn, conn.transaction():
            status = attempts.load_status(conn, attempt, lock=True)
            if status.state == COMMITTED:
                return self._result(conn, attempt, ALREADY_COMMITTED, status, started)
            if status.window_state == COMMITTED:
                return self._skip(conn, attempt, status, started)
            plan = self.ledger.load_plan(conn, attempt.window)
            ends = {r.tp: r.end_offset for r in plan.ranges} if plan else {}
            partitions = client.check_topic(self.kafka_config, self.topic)
            failures: list[tuple] = []
            producer = self._init_producer(attempt, failures)
            marker = client.read_marker(self.kafka_config, self.marker_group(attempt), self.topic, ends)
            if marker is None:
                marker = self._settle_intents(conn, attempt.window)
            if marker is not None:
                committed = self._record_marker(conn, attempt.window, marker)
                log.info("%s: the window's transaction committed in Kafka by attempt %d (commit %d); the ledger is "
                         "told now", attempt, committed.epoch, marker.token)
                status = attempts.load_status(conn, attempt)
                if committed.epoch == attempt.epoch:
                    return self._result(conn, attempt, ALREADY_COMMITTED, status, started)
                return self._skip(conn, attempt, status, started)
            attempts.check_committable(attempt, status)
            checkpoint = attempts.load_checkpoint(conn, attempt)
            problems = self.staging_problems(attempt, checkpoint)
            if problems:
                raise NotPrepared(f"cannot commit {attempt}: its staging no longer holds what it checkpointed; "
                                  "nothing published, stage the window again:\n  " + "\n  ".join(problems),
                                  missing=problems)
            token = client.new_token(attempt.epoch)
            self._open_intent(attempt, token, checkpoint.row_count, partitions)
            produced = self._produce(conn, producer, failures, attempt, token, [c.chunk for c in checkpoint.chunks],
                                     ends)
            fault_point("commit.after_kafka_commit")
            self._record(conn, attempt, token, checkpoint.row_count, produced)
            status = attempts.load_status(conn, attempt)
            return self._result(conn, attempt, PUBLISHED, status, started)

    # ------------------------------------------------------------------ the ledger

    def _result(self, conn: psycopg.Connection, attempt: Attempt, outcome, status: AttemptStatus,
                started: float) -> CommitResult:
        result = CommitResult(attempt, outcome, status.committed_epoch, status.published_rows or 0,
                              status.dead_letter_rows or 0, offsets=attempts.load_offsets(conn, attempt.pipeline),
                              seconds=time.monotonic() - started)
        log.info("%s", result)
        return result

    def _skip(self, conn: psycopg.Connection, attempt: Attempt, status: AttemptStatus,
              started: float) -> CommitResult:
        attempts.mark_aborted(conn, attempt, f"window already committed by attempt {status.committed_epoch}; "
                                             "on_committed='skip'")
        self._drop_staging(conn, attempt)
        return self._result(conn, attempt, SKIPPED, status, started)

    def _record(self, conn: psycopg.Connection, attempt: Attempt, token: int, rows: int,
                produced: int | None) -> None:
        """Mark the window committed by ``attempt`` (whose transaction with
        ``token`` committed in Kafka), with its dead letters, and drop its
        staging. In the transaction holding the window's lock."""
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
        attempts.mark_committed(conn, attempt, rows, dead)
        resolve_committed(conn, self.target_id, attempt, token)
        conn.execute(
            "INSERT INTO eos.kafka_commits (pipeline, window_start, target, epoch, token, transactional_id,"
            " marker_group, records) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (attempt.pipeline, attempt.window_start, self.target_id, attempt.epoch, token,
             self.transactional_id(attempt), self.marker_group(attempt), produced))
        self._drop_staging(conn, attempt)

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
        self._record(conn, committed, marker.token, checkpoint.row_count, None)
        return committed

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
        if row is None or row[0] == COMMITTED:
            return None
        plan = self.ledger.load_plan(conn, window)
        ends = {r.tp: r.end_offset for r in plan.ranges} if plan else {}
        producer = self._init_producer(window)
        del producer
        marker = client.read_marker(self.kafka_config, self.marker_group(window), self.topic, ends) \
            or self._settle_intents(conn, window)
        if marker is None:
            return None
        committed = self._record_marker(conn, window, marker)
        log.info("%s: its transaction had committed in Kafka; the ledger is told now", committed)
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
                 chunks: list[int], ends: Mapping[TopicPartition, int]) -> int:
        """One Kafka transaction: every checkpointed staged row as a record,
        then the marker offsets; commit. Returns the records produced.
        Aborts the transaction (and raises) on any error.

        The rows come through a binary server-side cursor with the lineage
        already as the header's bytes (``convert_to`` in the query): bytea
        columns arrive as bytes, nothing is converted per row in Python."""
        from confluent_kafka import Consumer, KafkaException
        from psycopg import sql
        produced = 0
        group = self.marker_group(attempt)
        fixed = [(client.H_PIPELINE, attempt.pipeline.encode()),
                 (client.H_WINDOW_START, to_utc(attempt.window_start).isoformat().encode()),
                 (client.H_WINDOW_END, to_utc(attempt.window_end).isoformat().encode()),
                 (client.H_EPOCH, str(attempt.epoch).encode()), (client.H_COMMIT, str(token).encode())]
        key_at = 0 if self.key_column else None
        value_at = 1 if self.key_column else 0
        headers_at = value_at + 1
        header_names = list(enumerate(self.header_columns, headers_at))
        h_topic, h_partition, h_offset = client.H_TOPIC, client.H_PARTITION, client.H_OFFSET
        rows_table, _ = staging_ids(attempt.staging)
        total = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {} = ANY(%s)").format(
            rows_table, sql.Identifier(CHUNK_COLUMN)), (chunks,)).fetchone()[0]
        midpoint = max(1, total // 2)

        producer.begin_transaction()
        try:
            fault_point("commit.before_publish")
            lineage = [sql.SQL("convert_to({}::text, 'UTF8')").format(sql.Identifier(c))
                       for c in LINEAGE_COLUMNS]
            with conn.cursor(name=f"eos_kafka_{attempt.epoch}", binary=True) as cur:
                cur.itersize = FETCH_ROWS
                cur.execute(sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s) ORDER BY eos_topic, eos_partition,"
                                    " eos_offset").format(
                    sql.SQL(", ").join([*map(sql.Identifier, self.record_columns), *lineage]),
                    rows_table, sql.Identifier(CHUNK_COLUMN)), (chunks,))
                for row in cur:
                    topic, partition, offset = row[-3:]
                    headers = [*fixed, (h_topic, topic), (h_partition, partition), (h_offset, offset)]
                    headers += [(name, row[i]) for i, name in header_names if row[i] is not None]
                    key = row[key_at] if key_at is not None else None
                    self._send(producer, key, row[value_at], headers, row[-3:])
                    produced += 1
                    if failures:
                        break
                    if produced == midpoint:
                        producer.flush(client.TIMEOUT)
                        fault_point("commit.mid_produce")
            remaining = producer.flush(client.TIMEOUT)
            if failures:
                raise TargetError(f"cannot publish {attempt} into topic {self.topic}: "
                                  + "; ".join(self._failed_sources(conn, rows_table, chunks, failures))
                                  + " (nothing of the window is published: its transaction is "
                                  "aborted; a record too large needs the producer's message.max.bytes and the "
                                  "topic's max.message.bytes raised, or a smaller record)")
            if remaining:
                raise TargetError(f"cannot publish {attempt} into topic {self.topic}: {remaining} record(s) not "
                                  f"delivered within {client.TIMEOUT:.0f}s; the transaction is aborted")
            fault_point("commit.after_publish")
            consumer = Consumer({**client._client(self.kafka_config), "group.id": group, "enable.auto.commit": False})
            try:
                producer.send_offsets_to_transaction(client.marker_offsets(self.topic, token, ends),
                                                     consumer.consumer_group_metadata(), client.TIMEOUT)
            finally:
                consumer.close()
        except BaseException:
            self._abort_transaction(producer, attempt, token)
            raise
        try:
            producer.commit_transaction(client.TIMEOUT)
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort():
                self._abort_transaction(producer, attempt, token)
            raise TargetError(f"the transaction of {attempt} into topic {self.topic} did not commit: {error.str()} "
                              "(fenced by another committer of the window, or the broker refused it); a retry tells "
                              "from the window's marker whether it committed") from exc
        log.info("%s: %d record(s) published into topic %s in transaction %s (commit %d)", attempt, produced,
                 self.topic, self.transactional_id(attempt), token)
        return produced

    def _failed_sources(self, conn: psycopg.Connection, rows_table, chunks: list[int],
                        failures: list[tuple]) -> list[str]:
        """Each failed delivery as "source record t[p]@o: error": a delivery
        report has the record's key and value, not its headers, so its
        source is looked up in the staging by them (on the error path only)."""
        from psycopg import sql
        named = []
        for error, key, value in failures:
            where = sql.SQL("{} IS NOT DISTINCT FROM %s AND ").format(sql.Identifier(self.key_column)) \
                if self.key_column else sql.SQL("")
            found = conn.execute(sql.SQL("SELECT eos_topic, eos_partition, eos_offset FROM {} WHERE {}{} = %s AND {} ="
                                         " ANY(%s) ORDER BY eos_topic, eos_partition, eos_offset LIMIT 1").format(
                rows_table, where, sql.Identifier(self.value_column), sql.Identifier(CHUNK_COLUMN)),
                ([key] if self.key_column else []) + [value, chunks]).fetchone()
            source = f"source record {found[0]}[{found[1]}]@{found[2]}" if found else "a record"
            named.append(f"{source}: {error}")
        return named

    def _send(self, producer, key, value, headers, lineage: tuple[bytes, bytes, bytes]) -> None:
        from confluent_kafka import KafkaError, KafkaException
        while True:
            try:
                producer.produce(self.topic, value=value, key=key, headers=headers)
                return
            except BufferError:
                producer.poll(0.05)
            except KafkaException as exc:
                source = "source record {}[{}]@{}".format(*(b.decode() for b in lineage))
                error = exc.args[0]
                size = len(value or b"") + len(key or b"")
                if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise TargetError(f"cannot publish into topic {self.topic}: the record of {source} is too large "
                                      f"({size} bytes of key and value, beyond the producer's message.max.bytes); "
                                      "nothing of the window is published (its transaction is aborted): raise "
                                      "message.max.bytes in producer_config and the topic's max.message.bytes, "
                                      "or make the record smaller") from exc
                raise TargetError(f"cannot publish the record of {source} into topic {self.topic}: "
                                  f"{error.str()}") from exc

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


