"""What ``verify`` reads of the Kafka target: the records of the target topic
that committed transactions of the pipeline published, as a temp table of the
ledger's connection. A mixin of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`.

The topic is read from its start to the end of every partition (read to
partition EOF: the embedded broker's high watermark is wrong) with
``isolation.level=read_committed``. A real Kafka hides the records of aborted
transactions then; the embedded broker does not, so a record counts only if
its lineage headers name a commit the ledger records (``eos.kafka_commits``:
the token of the window's committed transaction, which the marker also
holds). A record of the pipeline that no committed transaction names (an
aborted try, a fenced zombie's) is left out: on a real Kafka none is there.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_eos.core.errors import TargetError
from airflow_eos.core.windows import to_utc
from airflow_eos.targets.kafka import client

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

log = logging.getLogger(__name__)


class KafkaPublished:
    """``published_records`` and ``published_relation`` of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`."""

    def published_records(self, pipeline: str, *, timeout: float = 60.0,
                          committed_only: set[tuple[str, int]] | None = None) -> list[dict]:
        """Every record of the topic whose headers name ``pipeline`` (and, if
        ``committed_only`` is given, a (window_start ISO, token) in it), as
        dicts of its headers, key, value, partition and offset."""
        from confluent_kafka import Consumer, KafkaError
        from confluent_kafka import TopicPartition as KafkaTP
        partitions = client.check_topic(self.kafka_config, self.topic)
        consumer = Consumer({**client._client(self.kafka_config), "group.id": f"eos-verify-{secrets.token_hex(6)}",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
        found = []
        try:
            consumer.assign([KafkaTP(self.topic, p, 0) for p in range(partitions)])
            pending = set(range(partitions))
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
                if headers.get(client.H_PIPELINE) != pipeline:
                    continue
                if committed_only is not None and (headers.get(client.H_WINDOW_START),
                                                   int(headers.get(client.H_COMMIT, 0))) not in committed_only:
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
        commits = conn.execute("SELECT window_start, token FROM eos.kafka_commits WHERE pipeline = %s AND target = %s",
                               (pipeline, self.target_id)).fetchall()
        committed = {(to_utc(ws).isoformat(), int(token)) for ws, token in commits}
        records = self.published_records(pipeline, committed_only=committed)
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


def _int(text: str | None) -> int | None:
    return None if text is None else int(text)
