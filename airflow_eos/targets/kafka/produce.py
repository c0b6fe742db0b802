"""The Kafka target's produce loop: the checkpointed staged rows of an
attempt, read in source order from the PostgreSQL staging, as records of the
commit's Kafka transaction (key, value, header columns, and the lineage
headers with the window and the commit token). A mixin of
:class:`~airflow_eos.targets.kafka.commit.KafkaCommit`, which runs the
transaction around it (:mod:`~airflow_eos.targets.kafka.commit`)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from airflow_eos.core.attempt import Attempt
from airflow_eos.core.columns import LINEAGE_COLUMNS
from airflow_eos.core.errors import TargetError
from airflow_eos.core.windows import to_utc
from airflow_eos.staging.tables import CHUNK_COLUMN, staging_ids
from airflow_eos.targets.kafka import client

if TYPE_CHECKING:
    import psycopg

FETCH_ROWS = 10_000


class KafkaProduce:
    """Staged rows → records of the open transaction, and the errors that
    name the source record of a record Kafka refused."""

    topic: str
    key_column: str | None
    value_column: str
    header_columns: tuple[str, ...]
    record_columns: tuple[str, ...]

    def _mid_produce(self, producer) -> None:
        """Half the records sent (the commit's, see KafkaCommit._mid_produce)."""
        raise NotImplementedError

    @staticmethod
    def _count_rows(conn: psycopg.Connection, rows_table, chunks: list[int]) -> int:
        from psycopg import sql
        return conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {} = ANY(%s)").format(
            rows_table, sql.Identifier(CHUNK_COLUMN)), (chunks,)).fetchone()[0]

    @staticmethod
    def _window_headers(attempt: Attempt, token: int) -> list[tuple[str, bytes]]:
        """The headers every record of the window's transaction carries: the
        window, the attempt's epoch and the commit token."""
        return [(client.H_PIPELINE, attempt.pipeline.encode()),
                (client.H_WINDOW_START, to_utc(attempt.window_start).isoformat().encode()),
                (client.H_WINDOW_END, to_utc(attempt.window_end).isoformat().encode()),
                (client.H_EPOCH, str(attempt.epoch).encode()), (client.H_COMMIT, str(token).encode())]

    def _send_rows(self, conn: psycopg.Connection, producer, failures: list[tuple], attempt: Attempt, token: int,
                   chunks: list[int], midpoint: int) -> int:
        """Send the checkpointed chunks' rows as records, in source order;
        stop at the first failed delivery; at ``midpoint``, the commit's
        :meth:`_mid_produce`. Returns the records sent.

        The rows come through a binary server-side cursor, a batch of rows per
        fetch, the lineage as its own types (text, int, int: formatting it in
        the query cost the server more than the offset's bytes cost here).
        The loop is the commit's hot path (one pass per record): the headers a
        source partition's records share are built once per partition, the
        header columns are looked up by precomputed position, and ``produce``
        is called here, leaving :meth:`_send` to the rare record that finds
        the queue full or fails."""
        from confluent_kafka import KafkaException
        key_at = 0 if self.key_column else None
        value_at = 1 if self.key_column else 0
        header_at = tuple(enumerate(self.header_columns, value_at + 1))
        h_offset, topic, produce = client.H_OFFSET, self.topic, producer.produce
        shared, source_topic, source_partition = [], None, None  # the current source partition's headers
        produced = 0
        with self._staged_rows(conn, attempt, chunks) as cur:
            while rows := cur.fetchmany(FETCH_ROWS):
                for row in rows:
                    if row[-2] != source_partition or row[-3] != source_topic:
                        source_topic, source_partition = row[-3], row[-2]
                        shared = self._source_headers(attempt, token, _text(source_topic), _text(source_partition))
                    offset = row[-1]
                    headers = [*shared, (h_offset, b"%d" % offset if offset is not None else None)]
                    for i, name in header_at:
                        if row[i] is not None:
                            headers.append((name, row[i]))
                    key = row[key_at] if key_at is not None else None
                    try:
                        produce(topic, value=row[value_at], key=key, headers=headers)
                    except BufferError:
                        self._send(producer, key, row[value_at], headers, row[-3:])
                    except KafkaException as exc:
                        raise self._refused(exc, key, row[value_at], row[-3:]) from exc
                    produced += 1
                    if failures:
                        return produced
                    if produced == midpoint:
                        self._mid_produce(producer)
        return produced

    @contextmanager
    def _staged_rows(self, conn: psycopg.Connection, attempt: Attempt, chunks: list[int]):
        """A binary server-side cursor over the checkpointed chunks' rows in
        source order: the record columns, then the lineage columns."""
        from psycopg import sql
        rows_table, _ = staging_ids(attempt.staging)
        with conn.cursor(name=f"eos_kafka_{attempt.epoch}", binary=True) as cur:
            cur.execute(sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s) ORDER BY eos_topic, eos_partition,"
                                " eos_offset").format(
                sql.SQL(", ").join(map(sql.Identifier, (*self.record_columns, *LINEAGE_COLUMNS))),
                rows_table, sql.Identifier(CHUNK_COLUMN)), (chunks,))
            yield cur

    @classmethod
    def _source_headers(cls, attempt: Attempt, token: int, topic: bytes | None,
                        partition: bytes | None) -> list[tuple[str, bytes | None]]:
        """The headers every record from one source partition carries: the
        window's, then the source topic and partition (the offset follows)."""
        return [*cls._window_headers(attempt, token), (client.H_TOPIC, topic), (client.H_PARTITION, partition)]

    def _check_delivered(self, conn: psycopg.Connection, producer, failures: list[tuple], attempt: Attempt,
                         chunks: list[int]) -> None:
        """Wait for every record's delivery; TargetError (naming the source
        records of failed deliveries) if any failed or did not arrive in time."""
        remaining = producer.flush(client.TIMEOUT)
        if failures:
            rows_table, _ = staging_ids(attempt.staging)
            raise TargetError(f"cannot publish {attempt} into topic {self.topic}: "
                              + "; ".join(self._failed_sources(conn, rows_table, chunks, failures))
                              + " (nothing of the window is published: its transaction is "
                              "aborted; a record too large needs the producer's message.max.bytes and the "
                              "topic's max.message.bytes raised, or a smaller record)")
        if remaining:
            raise TargetError(f"cannot publish {attempt} into topic {self.topic}: {remaining} record(s) not "
                              f"delivered within {client.TIMEOUT:.0f}s; the transaction is aborted")

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

    def _send(self, producer, key, value, headers, lineage: tuple) -> None:
        """Produce one record, waiting for room in the producer's queue."""
        from confluent_kafka import KafkaException
        while True:
            try:
                producer.produce(self.topic, value=value, key=key, headers=headers)
                return
            except BufferError:
                producer.poll(0.05)
            except KafkaException as exc:
                raise self._refused(exc, key, value, lineage) from exc

    def _refused(self, exc, key, value, lineage: tuple) -> TargetError:
        """The error of a record ``produce`` refused, naming its source record."""
        from confluent_kafka import KafkaError
        source = "source record {}[{}]@{}".format(*lineage)
        error = exc.args[0]
        size = len(value or b"") + len(key or b"")
        if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            return TargetError(f"cannot publish into topic {self.topic}: the record of {source} is too large "
                               f"({size} bytes of key and value, beyond the producer's message.max.bytes); "
                               "nothing of the window is published (its transaction is aborted): raise "
                               "message.max.bytes in producer_config and the topic's max.message.bytes, "
                               "or make the record smaller")
        return TargetError(f"cannot publish the record of {source} into topic {self.topic}: {error.str()}")


def _text(value: str | int | None) -> bytes | None:
    """A lineage value as its header's bytes (what ``::text`` gives, in UTF-8)."""
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else b"%d" % value
