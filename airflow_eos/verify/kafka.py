"""Reading Kafka for ``verify``: the offsets of the records present in each
committed window's planned ranges (offsets have gaps: transaction markers,
compaction), copied into a temp table of the audit's transaction; which offsets
of those ranges retention has deleted since (no longer checkable against the
source, a temp table too); which ranges are in compacted topics (the cleaner may
have removed records of them since their window was read); and whether a
partition is held at its last committed end cut (see core.plan).

Offsets travel as contiguous runs (first, last): a range without gaps is a
handful of runs, not a line of COPY text per record; PostgreSQL expands them."""

from __future__ import annotations

import bisect
import contextlib
import itertools
import operator
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from confluent_kafka import KafkaError, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from airflow_eos.core.kafka_errors import kafka_error
from airflow_eos.core.ledger import WindowState
from airflow_eos.core.errors import LogTruncated, OffsetsExpired, SourceUnavailable, UnknownTopic
from airflow_eos.core.skew import held_behind, records_after
from airflow_eos.core.consumer_pool import CONSUMERS, of_another_partition
from airflow_eos.core.kafka_client import CONSUMER_ONLY, READER_KAFKA_DEFAULTS, client_logging, consumer_config
from airflow_eos.core.source import Bounds, KafkaLog, PartitionLog
from airflow_eos.core.windows import PartitionRange, TopicPartition, describe_millis, to_millis
from airflow_eos.verify.report import HELD, SOURCE, NotCheckable, Violation, _at, _Window


@dataclass
class Read:
    """What reading Kafka found, for the audit."""

    counts: dict[tuple[datetime, TopicPartition], int] = field(default_factory=dict)  # records per window and range
    unreadable: set[datetime] = field(default_factory=set)  # windows with a range Kafka cannot give any more
    violations: list[Violation] = field(default_factory=list)  # SOURCE and HELD
    # offsets of committed ranges retention deleted since, also in the temp table eos_verify_expired
    expired: list[NotCheckable] = field(default_factory=list)
    # (window, partition) of the committed ranges in compacted topics, also in the temp table eos_verify_compacted
    compacted: set[tuple[datetime, TopicPartition]] = field(default_factory=set)


def read_records(conn: psycopg.Connection, windows: Mapping[datetime, _Window],
                 kafka: PartitionLog | Mapping[str, Any], timeout: float, max_timestamp_skew: timedelta) -> Read:
    """The offsets of the records present in every committed window's ranges,
    into the temp table eos_verify_records (window_start, topic, partition,
    offset): COPY'd as runs into eos_verify_runs, expanded by one INSERT.
    Offsets retention has deleted since (before the partition's log start)
    are no longer checkable against the source: noted in ``read.expired`` and
    the temp table eos_verify_expired, the rest of the range is read. A range
    that cannot be read otherwise (the topic recreated or gone) is a
    violation; its window is left out of the record comparisons. A held
    partition is one too (see _held)."""
    read = Read()
    conn.execute('CREATE TEMP TABLE eos_verify_records (window_start timestamptz NOT NULL,'
                 ' topic text NOT NULL, partition integer NOT NULL, "offset" bigint NOT NULL) ON COMMIT DROP')
    conn.execute('CREATE TEMP TABLE eos_verify_runs (window_start timestamptz NOT NULL, topic text NOT NULL,'
                 ' partition integer NOT NULL, first bigint NOT NULL, last bigint NOT NULL) ON COMMIT DROP')
    bounds: dict[TopicPartition, Bounds] = {}
    with contextlib.ExitStack() as stack:
        log_, reader = kafka, None
        if isinstance(kafka, Mapping):
            log_ = stack.enter_context(KafkaLog(dict(kafka), timeout=timeout))
            reader = _KafkaRecords(kafka, timeout)
        with conn.cursor() as cur, cur.copy("COPY eos_verify_runs FROM STDIN") as copy:
            for w in windows.values():
                if w.state != WindowState.COMMITTED:
                    continue
                for r in w.ranges:
                    if r.width == 0:
                        read.counts[w.start, r.tp] = 0
                        continue
                    try:
                        if r.tp not in bounds:
                            bounds[r.tp] = log_.bounds(r.tp)
                        _check_end(r, bounds[r.tp])
                        readable = _readable_part(w.start, r, bounds[r.tp], read)
                        count = _copy_offsets(copy, w.start, readable, log_, reader) if readable.width else 0
                    except OffsetsExpired as exc:  # retention deleted them while verify read the range
                        read.expired.append(NotCheckable(w.start, r.tp, r.start_offset, r.end_offset,
                                                         f"while verify read the range: {exc}"))
                        continue
                    except (LogTruncated, UnknownTopic) as exc:
                        read.unreadable.add(w.start)
                        read.violations.append(Violation(
                            SOURCE, f"{_at(w.start)}: {r.tp} [{r.start_offset}, {r.end_offset}) cannot be read "
                                    f"from Kafka, so its records cannot be checked: {exc}",
                            w.start, r.topic, r.partition, r.start_offset))
                        continue
                    if readable == r:  # a count of part of a range says nothing of the whole
                        read.counts[w.start, r.tp] = count
        conn.execute('INSERT INTO eos_verify_records SELECT window_start, topic, partition,'
                     ' generate_series(first, last) FROM eos_verify_runs')
        read.violations += _held(log_, bounds, windows, max_timestamp_skew)
    _note_expired(conn, read)
    _note_compacted(conn, windows, kafka, read)
    return read


def _readable_part(ws: datetime, r: PartitionRange, bounds: Bounds, read: Read) -> PartitionRange:
    """The part of ``r`` still in the log; the part before the log start,
    which retention deleted, is noted in ``read.expired``."""
    if r.start_offset >= bounds.log_start:
        return r
    deleted_to = min(bounds.log_start, r.end_offset)
    read.expired.append(NotCheckable(ws, r.tp, r.start_offset, deleted_to,
                                     f"the log now starts at offset {bounds.log_start}"))
    return PartitionRange(r.topic, r.partition, deleted_to, r.end_offset)


def _copy_offsets(copy: psycopg.Copy, ws: datetime, r: PartitionRange, log_: PartitionLog,
                  reader: _KafkaRecords | None) -> int:
    """COPY the runs of offsets of the records present in ``r`` as window ``ws``'s; how many records."""
    # Kafka topic names are [a-zA-Z0-9._-]: nothing to escape in COPY's text format.
    prefix = f"{ws.isoformat()}\t{r.topic}\t{r.partition}\t"
    batches = (reader.runs(r) if reader is not None else
               [_runs([rec.offset for rec in log_.records(r.tp, r.start_offset, r.end_offset)])])
    count = 0
    for runs in batches:
        if runs:
            copy.write("".join(f"{prefix}{first}\t{last}\n" for first, last in runs))
            count += sum(last - first + 1 for first, last in runs)
    return count


def _note_expired(conn: psycopg.Connection, read: Read) -> None:
    """The offsets retention deleted, into the temp table eos_verify_expired
    (window_start, topic, partition, start_offset, end_offset): a row there is
    checked against its window's ranges and for duplicates, not against a record."""
    conn.execute("CREATE TEMP TABLE eos_verify_expired (window_start timestamptz NOT NULL, topic text NOT NULL,"
                 " partition integer NOT NULL, start_offset bigint NOT NULL, end_offset bigint NOT NULL)"
                 " ON COMMIT DROP")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO eos_verify_expired VALUES (%s, %s, %s, %s, %s)",
                        [(x.window_start, x.tp.topic, x.tp.partition, x.start_offset, x.end_offset)
                         for x in read.expired])


def _note_compacted(conn: psycopg.Connection, windows: Mapping[datetime, _Window],
                    kafka: PartitionLog | Mapping[str, Any], read: Read) -> None:
    """The committed ranges of compacted topics, into ``read.compacted`` and the
    temp table eos_verify_compacted (window_start, topic, partition,
    start_offset, end_offset): there a record the window published may have
    been removed by the cleaner since (a PartitionLog given instead of a
    configuration is taken as never compacted)."""
    conn.execute("CREATE TEMP TABLE eos_verify_compacted (window_start timestamptz NOT NULL, topic text NOT NULL,"
                 " partition integer NOT NULL, start_offset bigint NOT NULL, end_offset bigint NOT NULL)"
                 " ON COMMIT DROP")
    committed = [(w.start, r) for w in windows.values() if w.state == WindowState.COMMITTED for r in w.ranges]
    if not isinstance(kafka, Mapping) or not committed:
        return
    compacted = compacted_topics(kafka, sorted({r.topic for _, r in committed}))
    rows = [(ws, r.topic, r.partition, r.start_offset, r.end_offset) for ws, r in committed if r.topic in compacted]
    read.compacted = {(ws, TopicPartition(topic, partition)) for ws, topic, partition, _, _ in rows}
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO eos_verify_compacted VALUES (%s, %s, %s, %s, %s)", rows)


def compacted_topics(kafka_config: Mapping[str, Any], topics: list[str]) -> set[str]:
    """The topics whose ``cleanup.policy`` includes ``compact``. A topic whose
    configuration cannot be read counts as not compacted: every record its
    windows published must then still be there (the stricter audit)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({**client_logging(), **{k: v for k, v in kafka_config.items() if k not in CONSUMER_ONLY}})
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics],
                                     request_timeout=10)
    compacted = set()
    for resource, future in futures.items():
        try:
            policy = future.result(15).get("cleanup.policy")
        except Exception:  # noqa: BLE001 - not allowed to describe it, or gone: audited as not compacted
            continue
        if policy is not None and "compact" in (policy.value or ""):
            compacted.add(resource.name)
    return compacted



def _held(log_: PartitionLog, bounds: dict[TopicPartition, Bounds], windows: Mapping[datetime, _Window],
          max_timestamp_skew: timedelta) -> list[Violation]:
    """Per partition, the end cut of the last committed window that plans it:
    a record stamped beyond the skew there, with older records after it,
    holds the partition (every later window would plan it empty)."""
    violations: list[Violation] = []
    last: dict[TopicPartition, tuple[int, datetime, datetime]] = {}
    for w in windows.values():
        if w.state == WindowState.COMMITTED:
            for r in w.ranges:
                last[r.tp] = max(last.get(r.tp, (r.end_offset, w.end, w.start)), (r.end_offset, w.end, w.start))
    skew_ms = int(max_timestamp_skew.total_seconds() * 1000)
    for tp, (cut, end, ws) in sorted(last.items()):
        try:
            if tp not in bounds:
                bounds[tp] = log_.bounds(tp)
            record = log_.first_at_or_after(tp, cut, bounds[tp].end)
            if record is None or record.timestamp_ms <= to_millis(end) + skew_ms:
                continue
            after, read_to = records_after(log_, tp, record.offset, bounds[tp].end)
            older = held_behind(log_, tp, record, after, read_to, to_millis(end), skew_ms, bounds[tp].end)
        except (OffsetsExpired, LogTruncated, UnknownTopic):
            continue  # reported as SOURCE where a committed range cannot be read
        if older is None:
            continue
        violations.append(Violation(
            HELD, f"{_at(ws)}: {tp} is held at offset {record.offset}, the window's end cut: that record is "
                  f"stamped {describe_millis(record.timestamp_ms)}, more than max_timestamp_skew "
                  f"({max_timestamp_skew}) beyond the window's end {end.isoformat()}, and offset "
                  f"{older.offset} after it is stamped {describe_millis(older.timestamp_ms)}, before that end. "
                  f"At least {1 + len(after)} record(s) from offset {record.offset} on wait for a window ending "
                  f"after {describe_millis(record.timestamp_ms)}; plan the next windows with this version "
                  "(it refuses such a cut, or with on_skewed_timestamp=\"position\" publishes past it)",
            ws, tp.topic, tp.partition, record.offset))
    return violations


# --------------------------------------------------------------------------- reading Kafka


class _KafkaRecords:
    """Runs of offsets of the records present in planned ranges, with batched
    fetches and the reader's throughput settings. The end of a partition is where a
    fetch reports it, never the reported high watermark (see core.source)."""

    BATCH = 10_000

    def __init__(self, kafka_config: Mapping[str, Any], timeout: float):
        self.timeout = timeout
        self.config = consumer_config({**READER_KAFKA_DEFAULTS, **kafka_config})

    def runs(self, r: PartitionRange) -> Iterator[list[tuple[int, int]]]:
        """Per fetched batch, the contiguous runs (first, last) of the range's offsets in it."""
        with CONSUMERS.lease(self.config, "Kafka consumer") as pooled:
            consumer = pooled.consumer
            consumer.assign([KafkaTopicPartition(r.topic, r.partition, r.start_offset)])
            last = r.start_offset - 1
            answered = time.monotonic()
            while True:
                # consume() waits for a full batch or its timeout: drain what is
                # there, and block only in poll() for the next fetch.
                messages = consumer.consume(self.BATCH, timeout=0)
                if not messages:
                    msg = consumer.poll(min(0.1, self.timeout))
                    messages = [msg] if msg is not None else []
                if not messages:
                    if time.monotonic() - answered > self.timeout:
                        raise SourceUnavailable(f"no answer from Kafka at {self.config['bootstrap.servers']} "
                                                f"reading {r.tp} at offset {last + 1} within {self.timeout}s")
                    continue
                answered = time.monotonic()
                batch, done = _in_order(messages, r, last)
                if batch is None:
                    batch, done = _one_by_one(messages, r, last)
                runs = _runs(batch)
                if runs:
                    last = runs[-1][1]
                yield runs
                if done:
                    return


def _in_order(messages: list[Message], r: PartitionRange, last: int) -> tuple[list[int] | None, bool]:
    """The common batch, without a Python step per record: no error, every
    message of the range's partition, offsets increasing. Its offsets after
    ``last`` and before the range's end, and whether the range is read to its
    end; (None, False) for any other batch (see _one_by_one)."""
    if any(map(Message.error, messages)) or any(p != r.partition for p in set(map(Message.partition, messages))) \
            or any(t != r.topic for t in set(map(Message.topic, messages))):
        return None, False
    offsets = list(map(Message.offset, messages))
    if not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
        return None, False
    start, stop = bisect.bisect_right(offsets, last), bisect.bisect_left(offsets, r.end_offset)
    batch = offsets[start:stop]
    return batch, stop < len(offsets) or (bool(batch) and batch[-1] == r.end_offset - 1)


def _one_by_one(messages: list[Message], r: PartitionRange, last: int) -> tuple[list[int], bool]:
    """A batch with an error or end of partition, or with messages of an
    earlier assignment: each message looked at in turn."""
    batch: list[int] = []
    for msg in messages:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                if msg.offset() < r.end_offset:
                    raise LogTruncated(f"the log ends at offset {msg.offset()} (the topic was recreated or lost data)")
                return batch, True
            error = kafka_error(err, str(r.tp), offset=last + 1)
            if error is not None:
                raise error
            continue
        offset = msg.offset()
        # skip what a fetch of an earlier assignment may still deliver
        if of_another_partition(msg, r.topic, r.partition) or offset <= last:
            continue
        if offset >= r.end_offset:
            return batch, True
        batch.append(offset)
        last = offset
        if offset == r.end_offset - 1:
            return batch, True
    return batch, False


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Strictly increasing offsets as contiguous runs (first, last). Within a
    run offsets[j] - offsets[i] == j - i, and only there: each run's end is
    found by bisection, so a batch without gaps costs one comparison."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(offsets)
    while i < n:
        first, lo, hi = offsets[i], i, n - 1
        while lo < hi:
            if offsets[hi] - first == hi - i:
                lo = hi
                break
            mid = (lo + hi + 1) // 2
            if offsets[mid] - first == mid - i:
                lo = mid
            else:
                hi = mid - 1
        runs.append((first, offsets[lo]))
        i = lo + 1
    return runs


def _check_end(r: PartitionRange, bounds: Bounds) -> None:
    """Reading past the end would wait for records that never come (a broker
    need not report out-of-range offsets there), so compare with the bounds first."""
    if r.end_offset > bounds.end:
        raise LogTruncated(f"the log ends at offset {bounds.end} (the topic was recreated or lost data)")
