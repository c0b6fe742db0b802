"""What ``verify`` reads of the Kafka target: the records of the target topic
that committed transactions of the pipeline published, as a temp table of the
ledger's connection. A mixin of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`.

The topic is read from its start to the end of every partition (read to
partition EOF, never the high watermark) with
``isolation.level=read_committed``. Apache Kafka hides the records of aborted
transactions then; a Kafka-compatible broker may not, so a record counts only if
its lineage headers name a commit the ledger records (``eos.kafka_commits``:
the token of the window's committed transaction, which the marker also
holds). A record of the pipeline that no committed transaction names (an
aborted try, a fenced zombie's) is left out: on a real Kafka none is there.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_eos.core.errors import TargetError
from airflow_eos.core.sink import ForeignRecord
from airflow_eos.core.windows import to_utc
from airflow_eos.targets.kafka import client
from airflow_eos.targets.kafka.fields import KafkaSinkFields

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

log = logging.getLogger(__name__)


class KafkaPublished(KafkaSinkFields):
    """``published_records`` and ``published_relation`` of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`."""

    def published_records(self, pipeline: str, *, timeout: float = 60.0,
                          committed_only: set[tuple[str, int]] | None = None) -> list[dict]:
        """Every record of the topic whose headers name ``pipeline`` (and, if
        ``committed_only`` is given, a (window_start ISO, token) in it), as
        dicts of its headers, key, value, partition and offset."""
        def keep(headers: dict) -> bool:
            return headers.get(client.H_PIPELINE) == pipeline and (
                committed_only is None
                or (headers.get(client.H_WINDOW_START), int(headers.get(client.H_COMMIT, 0))) in committed_only)
        return self.read_topic(keep, timeout=timeout)

    def read_topic(self, keep: Callable[[dict], bool], *, timeout: float = 60.0,
                   start: Mapping[int, int] | None = None) -> list[dict]:
        """Every record of the whole topic, read with ``isolation.level=read_committed``
        as its readers read it, whose headers ``keep`` accepts (the lineage
        headers as text), as dicts of its headers, key, value, partition and offset.
        ``start``: from these offsets of these partitions only (a commit intent's
        scan); an offset the log no longer holds is then an error, not a jump
        to the end of the partition."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError
        from confluent_kafka import TopicPartition as KafkaTP
        if start is None:
            # from each log's start, wherever retention has moved it (offset 0 out of range would
            # send the consumer to the partition's end: everything reported missing)
            start = dict.fromkeys(range(client.check_topic(self.kafka_config, self.topic)), OFFSET_BEGINNING)
            reset = {"auto.offset.reset": "earliest"}
        else:
            reset = {"auto.offset.reset": "error"}
        consumer = Consumer({**client._client(self.kafka_config), "group.id": f"eos-verify-{secrets.token_hex(6)}",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "isolation.level": "read_committed", "fetch.wait.max.ms": 10, **reset})
        found = []
        try:
            _learn_leaders(consumer, timeout)
            consumer.assign([KafkaTP(self.topic, p, o) for p, o in start.items()])
            pending = set(start)
            deadline = time.monotonic() + timeout
            while pending:
                if time.monotonic() > deadline:
                    raise TargetError(f"reading topic {self.topic} to its end took longer than {timeout:.0f}s "
                                      f"(partitions {sorted(pending)} not at their end: a transaction left open "
                                      "stalls read_committed readers)")
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise TargetError(f"cannot read topic {self.topic}: {msg.error().str()}")
                # the lineage headers as text, the transform's header columns as sent (bytes)
                headers = {k: (v.decode() if k.startswith("eos-") else v) for k, v in (msg.headers() or [])
                           if v is not None}
                if not keep(headers):
                    continue
                found.append({"headers": headers, "key": msg.key(), "value": msg.value(),
                              "partition": msg.partition(), "offset": msg.offset()})
        finally:
            consumer.close()
        return found

    def published_relation(self, conn: psycopg.Connection, pipeline: str,
                           columns: Sequence[str] = ()) -> sql.Composable:
        """A TEMP table of the pipeline's records in the topic that committed
        transactions published: ``eos_pipeline``, ``eos_window_start``, the
        lineage ``eos_topic``, ``eos_partition``, ``eos_offset`` (from the
        headers), ``eos_epoch``, ``eos_commit``, and ``key``, ``value`` if asked."""
        from psycopg import sql
        records = self.published_records(pipeline, committed_only=self._committed(conn, pipeline))
        extra = [c for c in columns if c in ("key", "value")]
        name = f"eos_published_{secrets.token_hex(6)}"
        conn.execute(sql.SQL(
            "CREATE TEMP TABLE {} (eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL, eos_topic text,"
            " eos_partition integer, eos_offset bigint, eos_epoch integer, eos_commit bigint{})").format(
            sql.Identifier(name), sql.SQL("").join(sql.SQL(", {} bytea").format(sql.Identifier(c)) for c in extra)))
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(name))) as copy:
            for r in records:
                h = r["headers"]
                copy.write_row((pipeline, h[client.H_WINDOW_START], h.get(client.H_TOPIC),
                                _int(h.get(client.H_PARTITION)), _int(h.get(client.H_OFFSET)),
                                _int(h.get(client.H_EPOCH)), _int(h.get(client.H_COMMIT)),
                                *[r[c] for c in extra]))
        return sql.Identifier(name)


    def _committed(self, conn: psycopg.Connection, pipeline: str) -> set[tuple[str, int]]:
        """(window_start ISO, token) of each of the pipeline's committed transactions into this topic."""
        commits = conn.execute("SELECT window_start, token FROM eos.kafka_commits WHERE pipeline = %s AND target = %s",
                               (pipeline, self.target_id)).fetchall()
        return {(to_utc(ws).isoformat(), int(token)) for ws, token in commits}

    def unattributed(self, conn: psycopg.Connection, pipeline: str, topics: Sequence[str]) -> Iterator[ForeignRecord]:
        """Sink.unattributed: the records of the whole topic (read_committed)
        that no airflow-eos pipeline wrote, or that another pipeline published
        from one of ``topics``. The pipeline's own records are audited by
        :meth:`published_relation`; one of them that no committed transaction
        names is not reported here: Apache Kafka hides aborted transactions'
        records from read_committed readers, but a Kafka-compatible broker that
        shows them would make every aborted try of the pipeline foreign."""
        mine = set(topics)

        def foreign(h: dict) -> bool:
            owner = h.get(client.H_PIPELINE)
            return owner is None or (owner != pipeline and h.get(client.H_TOPIC) in mine)
        for r in self.read_topic(foreign):
            yield _foreign(self.topic, r)


def _foreign(topic: str, record: dict) -> ForeignRecord:
    h = record["headers"]
    where = f"topic {topic} partition {record['partition']} offset {record['offset']}"
    owner = h.get(client.H_PIPELINE)
    if owner is None:
        return ForeignRecord(where, "carries no airflow-eos lineage headers: a writer other than airflow-eos "
                                    "published it, and the topic's readers see it")
    source = f"{h.get(client.H_TOPIC)}[{h.get(client.H_PARTITION)}]@{h.get(client.H_OFFSET)}"
    return ForeignRecord(where, f"pipeline {owner!r} (window {h.get(client.H_WINDOW_START)}, epoch "
                                f"{h.get(client.H_EPOCH)}) published source record {source} of this pipeline's topics "
                                "into the same topic: its readers see that record twice",
                         h.get(client.H_TOPIC), _int(h.get(client.H_PARTITION)), _int(h.get(client.H_OFFSET)))


def _int(text: str | None) -> int | None:
    return None if text is None else int(text)


def _learn_leaders(consumer, timeout: float) -> None:
    """Ask for the cluster's metadata (one round trip) before assigning: a
    consumer assigned a partition whose leader it does not know yet looks a
    logical offset (OFFSET_BEGINNING) up again only after 500 ms, 0.5 s of a
    small topic's read (core/source.py's _fetch_metadata measures the same).
    Every topic, not this one: naming a topic may create it. Best effort: a
    broker that does not answer is reported by the read that follows."""
    from confluent_kafka import KafkaException
    try:
        consumer.list_topics(timeout=min(timeout, 1.0))
    except KafkaException:
        pass
