"""``airflow-eos verify``: prove, against Kafka, what a pipeline published.

For every committed window the records actually present in its planned ranges
are read from Kafka (offsets have gaps — transaction markers, compaction — so the
offset width is never taken for a count) and compared with the target:

- record-level pipelines (the target keeps the lineage columns ``eos_topic``,
  ``eos_partition``, ``eos_offset``): each record is published exactly once in
  its window or is a dead letter of the window's committed attempt; no row
  without a record of its window; row counts equal the ledger's;
- aggregate pipelines (no lineage): each window's row count equals the ledger's,
  its dead letters are records of the window, and, given ``count_column``, the
  counts add up to the window's records;
- both: the committed attempt's checkpoint covers the plan and counted the
  records Kafka holds, and ``eos.partition_offsets`` equals the contiguous
  committed prefix, computed here again from windows and ranges;
- no partition is held: the last committed end cut of a partition is not on a
  record stamped more than ``max_timestamp_skew`` beyond its window's end with
  older records after it (a cut frozen so holds every later window at that
  offset until one ends after the record's timestamp; see core.plan).

Comparisons run in SQL over temp tables (Kafka offsets arrive by COPY), inside
one repeatable-read transaction, so a commit running meanwhile is either wholly
seen or not at all, and a million records cost seconds, not Python sets.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from psycopg import sql
from psycopg.rows import dict_row

from airflow_eos.core.errors import (
    ConfigurationError,
    LedgerUnavailable,
    LogTruncated,
    OffsetsExpired,
    SourceUnavailable,
    TargetError,
    UnknownTopic,
)
from airflow_eos.core.kafka_errors import kafka_error
from airflow_eos.core.ledger import Ledger, redact
from airflow_eos.core.plan import DEFAULT_MAX_TIMESTAMP_SKEW, held_behind, records_after
from airflow_eos.targets.postgres.target import LINEAGE_COLUMNS, WINDOW_COLUMNS, PostgresTarget, parse_table_name
from airflow_eos.core.source import Bounds, KafkaLog, PartitionLog, consumer_config
from airflow_eos.core.windows import PartitionRange, TopicPartition, describe_millis, to_millis

# Violation kinds
DUPLICATE = "duplicate"  # a record published more than once in its window
DEAD_AND_PUBLISHED = "dead_and_published"  # a record that is a dead letter and also published
MISSING = "missing"  # a record neither published nor a dead letter
EXTRA = "extra"  # a row or dead letter without a record of its committed window behind it
COUNT = "count"  # the target's counts differ from the ledger's or from Kafka's
CHECKPOINT = "checkpoint"  # the committed attempt's checkpoint differs from plan or Kafka
OFFSETS = "offsets"  # eos.partition_offsets differs from the contiguous committed prefix
SOURCE = "source"  # planned records can no longer be read from Kafka
HELD = "held"  # a partition's last committed end cut is a skewed record that holds older records behind it
MORE = "more"  # further examples of a kind in a window, not listed one by one


@dataclass(frozen=True)
class Violation:
    kind: str
    message: str
    window_start: datetime | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        return self.message


@dataclass
class WindowAudit:
    """One window's numbers. ``None``: not determinable (the window is not
    committed, its records could not be read, or the target has no lineage)."""

    window_start: datetime | None
    window_end: datetime | None
    state: str  # planned | committed | unplanned (rows under a window the ledger does not know)
    committed_epoch: int | None = None
    recorded_rows: int | None = None  # eos.windows.published_rows
    recorded_dead_letters: int | None = None  # eos.windows.dead_letter_rows
    kafka_records: int | None = None
    published_rows: int = 0  # rows of the window in the target
    dead_letters: int = 0  # the window's rows in eos.dead_letters
    duplicates: int | None = 0
    missing: int | None = 0
    extra: int | None = 0


@dataclass(frozen=True)
class Totals:
    kafka_records: int | None
    published_rows: int
    dead_letters: int
    duplicates: int | None
    missing: int | None
    extra: int | None


@dataclass
class VerifyReport:
    pipeline: str
    table: str
    lineage: bool  # record-level (lineage columns) or aggregate
    windows: list[WindowAudit]
    offsets: dict[TopicPartition, int]  # eos.partition_offsets
    expected_offsets: dict[TopicPartition, int]  # the contiguous committed prefix, computed by verify
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.violations

    @property
    def committed_windows(self) -> int:
        return sum(w.state == "committed" for w in self.windows)

    @property
    def totals(self) -> Totals:
        """Sums over the windows; None where no window has the number."""
        def total(name: str) -> int | None:
            known = [n for n in (getattr(w, name) for w in self.windows) if n is not None]
            return sum(known) if known else None

        return Totals(*map(total, ("kafka_records", "published_rows", "dead_letters", "duplicates", "missing",
                                   "extra")))

    def __str__(self) -> str:
        t = self.totals
        head = (f"verify {self.pipeline} against {self.table}: {self.committed_windows} committed window(s), "
                f"{t.kafka_records} records in Kafka, {t.published_rows} rows published, {t.dead_letters} dead letters")
        if self.clean:
            return head + ": clean"
        return head + f": {len(self.violations)} violation(s)\n  " + "\n  ".join(map(str, self.violations))


def verify(ledger: Ledger, kafka: PartitionLog | Mapping[str, Any], target: PostgresTarget | str, pipeline: str,
           *, count_column: str | None = None, max_examples: int = 20, timeout: float = 10.0,
           max_timestamp_skew: timedelta = DEFAULT_MAX_TIMESTAMP_SKEW) -> VerifyReport:
    """Audit ``pipeline``'s rows in ``target`` (a PostgresTarget or a table name
    in the ledger's database) against Kafka.

    ``kafka`` is a confluent-kafka configuration (read with batched fetches:
    use it for large audits) or any PartitionLog, e.g. a KafkaLog. For an
    aggregate target, ``count_column`` names a column whose per-window sum plus
    the window's dead letters must equal its records. At most ``max_examples``
    violations of each kind are listed per window; the counts are exact.
    ``max_timestamp_skew`` is the pipeline's (see core.plan): how far beyond a
    window's end its end cut's record may be stamped before, with older records
    after it, the partition counts as held.

    Raises LedgerUnavailable, TargetError or ConfigurationError when the audit
    cannot run; every finding about the data is a Violation in the report.
    """
    started = time.monotonic()
    table = target.table if isinstance(target, PostgresTarget) else target
    schema, name = parse_table_name(table)
    target_id = sql.Identifier(name) if schema is None else sql.Identifier(schema, name)
    with ledger.connect() as conn:
        # One snapshot for ledger and target: a commit running meanwhile is seen wholly or not at all.
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            audit = _Audit(conn, ledger, pipeline, table, target_id, count_column, max_examples, max_timestamp_skew)
            audit.load()
            audit.read_kafka(kafka, timeout)
            audit.check()
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(f"verify lost the database {redact(ledger.url)}: {exc}") from exc
        finally:
            conn.rollback()
    report = audit.report
    report.seconds = time.monotonic() - started
    return report


# --------------------------------------------------------------------------- reading Kafka


class _KafkaRecords:
    """Offsets of the records present in planned ranges, with batched fetches.
    The end of a partition is where a fetch reports it, never the reported
    high watermark (see core.source)."""

    BATCH = 10_000

    def __init__(self, kafka_config: Mapping[str, Any], timeout: float):
        self.timeout = timeout
        self.config = consumer_config(dict(kafka_config))
        try:
            self._consumer = Consumer(self.config)
        except KafkaException as exc:
            raise SourceUnavailable(f"cannot create Kafka consumer: {exc}") from exc

    def close(self) -> None:
        self._consumer.close()

    def offsets(self, r: PartitionRange) -> Iterator[list[int]]:
        consumer = self._consumer
        consumer.assign([KafkaTopicPartition(r.topic, r.partition, r.start_offset)])
        try:
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
                batch: list[int] = []
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        code = err.code()
                        if code == KafkaError._PARTITION_EOF:
                            if msg.offset() < r.end_offset:
                                raise LogTruncated(f"the log ends at offset {msg.offset()} (the topic was recreated "
                                                   "or lost data)")
                            yield batch
                            return
                        error = kafka_error(err, str(r.tp), offset=last + 1)
                        if error is not None:
                            raise error
                        continue
                    offset = msg.offset()
                    # skip what a fetch of an earlier assignment may still deliver
                    if msg.topic() != r.topic or msg.partition() != r.partition or offset <= last:
                        continue
                    if offset >= r.end_offset:
                        yield batch
                        return
                    batch.append(offset)
                    last = offset
                    if offset == r.end_offset - 1:
                        yield batch
                        return
                yield batch
        finally:
            consumer.unassign()


def _check_bounds(r: PartitionRange, bounds: Bounds) -> None:
    """Reading past the end would wait for records that never come (a broker
    need not report out-of-range offsets there), so compare with the bounds first."""
    if r.start_offset < bounds.log_start:
        raise OffsetsExpired(f"the log now starts at offset {bounds.log_start} (retention deleted planned records)")
    if r.end_offset > bounds.end:
        raise LogTruncated(f"the log ends at offset {bounds.end} (the topic was recreated or lost data)")


# --------------------------------------------------------------------------- the audit


@dataclass
class _Window:
    start: datetime
    end: datetime
    state: str
    committed_epoch: int | None
    published_rows: int | None
    dead_letter_rows: int | None
    ranges: list[PartitionRange]


def _at(ws: datetime | None) -> str:
    return f"window {ws.astimezone(timezone.utc).isoformat()}" if ws is not None else "rows without a window"


def _where(topic, partition, offset) -> str:
    if topic is None or partition is None or offset is None:
        return f"lineage ({topic}, {partition}, {offset})"
    return f"{TopicPartition(topic, partition)} offset {offset}"


# Same window and same record: rows, Kafka records and dead letters are joined on these.
_SAME_RECORD = ("{a}.window_start = {b}.window_start AND {a}.topic = {b}.topic AND {a}.partition = {b}.partition"
                ' AND {a}."offset" = {b}."offset"')


def _same(a: str, b: str) -> str:
    return _SAME_RECORD.format(a=a, b=b)


class _Audit:
    def __init__(self, conn, ledger, pipeline, table, target_id, count_column, max_examples, max_timestamp_skew):
        self.conn: psycopg.Connection = conn
        self.ledger = ledger
        self.pipeline = pipeline
        self.table = table
        self.target_id = target_id
        # psycopg reads any % in a query's text as a placeholder, even inside a quoted identifier.
        self.target_sql = target_id.as_string(conn).replace("%", "%%")
        self.count_column = count_column
        self.max_examples = max(1, max_examples)
        self.max_timestamp_skew = max_timestamp_skew
        self.windows: dict[datetime, _Window] = {}
        self.unreadable: set[datetime] = set()
        self.kafka_counts: dict[tuple[datetime, TopicPartition], int] = {}
        self.audits: dict[datetime | None, WindowAudit] = {}
        self.violations: list[Violation] = []
        self.lineage = False
        self.offsets: dict[TopicPartition, int] = {}
        self.expected: dict[TopicPartition, int] = {}

    # ------------------------------------------------------------------ ledger and target

    def load(self) -> None:
        conn = self.conn
        if conn.execute("SELECT to_regclass('eos.windows') IS NULL").fetchone()[0]:
            raise LedgerUnavailable(f"no airflow-eos ledger in {redact(self.ledger.url)}: schema eos is missing")
        for row in conn.execute(
            "SELECT window_start, window_end, state, committed_epoch, published_rows, dead_letter_rows"
            " FROM eos.windows WHERE pipeline = %s ORDER BY window_start", (self.pipeline,),
        ):
            self.windows[row[0]] = _Window(*row, ranges=[])
        if not self.windows:
            known = [r[0] for r in conn.execute("SELECT DISTINCT pipeline FROM eos.windows ORDER BY 1 LIMIT 20")]
            raise ConfigurationError(f"pipeline {self.pipeline!r} has no windows in the ledger at "
                                     f"{redact(self.ledger.url)}" + (f"; it knows {', '.join(known)}" if known else ""))
        for ws, *r in conn.execute(
            "SELECT window_start, topic, partition, start_offset, end_offset FROM eos.window_ranges"
            " WHERE pipeline = %s ORDER BY window_start, topic, partition", (self.pipeline,),
        ):
            self.windows[ws].ranges.append(PartitionRange(*r))
        self._describe_target()
        for w in self.windows.values():
            self._audit(w.start, w)

    def _describe_target(self) -> None:
        oid = self.conn.execute("SELECT to_regclass(%s)::oid", (self.target_id.as_string(self.conn),)).fetchone()[0]
        if oid is None:
            raise TargetError(f"target table {self.table} does not exist in {redact(self.ledger.url)}")
        columns = {r[0] for r in self.conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped", (oid,))}
        if not all(c in columns for c in WINDOW_COLUMNS):
            raise TargetError(f"target table {self.table} has no columns {' and '.join(WINDOW_COLUMNS)}: verify "
                              "needs each row's window (modes 'replace_window', 'partition_per_window') to audit it")
        if self.count_column is not None and self.count_column not in columns:
            raise TargetError(f"target table {self.table} has no column {self.count_column!r} (count_column)")
        self.lineage = all(c in columns for c in LINEAGE_COLUMNS)

    # ------------------------------------------------------------------ Kafka

    def read_kafka(self, kafka: PartitionLog | Mapping[str, Any], timeout: float) -> None:
        """COPY the offsets of the records present in every committed window's
        ranges into a temp table. A range that cannot be read any more is a
        violation; its window is left out of the record comparisons."""
        self.conn.execute('CREATE TEMP TABLE eos_verify_records (window_start timestamptz NOT NULL,'
                          ' topic text NOT NULL, partition integer NOT NULL, "offset" bigint NOT NULL) ON COMMIT DROP')
        bounds: dict[TopicPartition, Bounds] = {}
        with contextlib.ExitStack() as stack:
            log_, reader = kafka, None
            if isinstance(kafka, Mapping):
                log_ = stack.enter_context(KafkaLog(dict(kafka), timeout=timeout))
                reader = _KafkaRecords(kafka, timeout)
                stack.callback(reader.close)
            with self.conn.cursor() as cur, cur.copy("COPY eos_verify_records FROM STDIN") as copy:
                for w in self.windows.values():
                    if w.state != "committed":
                        continue
                    for r in w.ranges:
                        if r.width == 0:
                            self.kafka_counts[w.start, r.tp] = 0
                            continue
                        # Kafka topic names are [a-zA-Z0-9._-]: nothing to escape in COPY's text format.
                        prefix = f"{w.start.isoformat()}\t{r.topic}\t{r.partition}\t"
                        count = 0
                        try:
                            if r.tp not in bounds:
                                bounds[r.tp] = log_.bounds(r.tp)
                            _check_bounds(r, bounds[r.tp])
                            batches = (reader.offsets(r) if reader is not None else
                                       [[rec.offset for rec in log_.records(r.tp, r.start_offset, r.end_offset)]])
                            for batch in batches:
                                if batch:
                                    copy.write("".join(f"{prefix}{o}\n" for o in batch))
                                    count += len(batch)
                        except (OffsetsExpired, LogTruncated, UnknownTopic) as exc:
                            self.unreadable.add(w.start)
                            self.violations.append(Violation(
                                SOURCE, f"{_at(w.start)}: {r.tp} [{r.start_offset}, {r.end_offset}) cannot be read "
                                        f"from Kafka, so its records cannot be checked: {exc}",
                                w.start, r.topic, r.partition, r.start_offset))
                            continue
                        self.kafka_counts[w.start, r.tp] = count
            self._check_held(log_, bounds)
        self.conn.execute("ANALYZE eos_verify_records")  # autovacuum never analyses temp tables
        for w in self.windows.values():
            if w.state == "committed" and w.start not in self.unreadable:
                self.audits[w.start].kafka_records = sum(self.kafka_counts[w.start, r.tp] for r in w.ranges)

    def _check_held(self, log_: PartitionLog, bounds: dict[TopicPartition, Bounds]) -> None:
        """Per partition, the end cut of the last committed window that plans it:
        a record stamped beyond the skew there, with older records after it,
        holds the partition (every later window would plan it empty)."""
        last: dict[TopicPartition, tuple[int, datetime, datetime]] = {}
        for w in self.windows.values():
            if w.state == "committed":
                for r in w.ranges:
                    last[r.tp] = max(last.get(r.tp, (r.end_offset, w.end, w.start)), (r.end_offset, w.end, w.start))
        skew_ms = int(self.max_timestamp_skew.total_seconds() * 1000)
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
            self.violations.append(Violation(
                HELD, f"{_at(ws)}: {tp} is held at offset {record.offset}, the window's end cut: that record is "
                      f"stamped {describe_millis(record.timestamp_ms)}, more than max_timestamp_skew "
                      f"({self.max_timestamp_skew}) beyond the window's end {end.isoformat()}, and offset "
                      f"{older.offset} after it is stamped {describe_millis(older.timestamp_ms)}, before that end. "
                      f"At least {1 + len(after)} record(s) from offset {record.offset} on wait for a window ending "
                      f"after {describe_millis(record.timestamp_ms)}; plan the next windows with this version "
                      "(it refuses such a cut, or with on_skewed_timestamp=\"position\" publishes past it)",
                ws, tp.topic, tp.partition, record.offset))

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        if self.lineage:
            self._diff()
        self._count_rows()
        self._check_dead_letters()
        if self.lineage:
            self._check_lineage()
        else:
            self._check_aggregates()
        self._check_counts()
        self._check_checkpoints()
        self._check_offsets()

    @property
    def _params(self) -> dict:
        return {"p": self.pipeline, "unreadable": sorted(self.unreadable), "limit": self.max_examples}

    def _audit(self, ws: datetime | None, window: _Window | None = None) -> WindowAudit:
        """A window's audit; also of windows the ledger does not know (rows
        under an unplanned window). Without lineage, duplicates, missing and
        extra records stay unknown (None) unless a check finds some."""
        if ws not in self.audits:
            known = 0 if self.lineage else None
            audit = WindowAudit(ws, None, "unplanned", duplicates=known, missing=known, extra=known)
            if window is not None:
                audit.window_end, audit.state, audit.committed_epoch = window.end, window.state, window.committed_epoch
                audit.recorded_rows, audit.recorded_dead_letters = window.published_rows, window.dead_letter_rows
            self.audits[ws] = audit
        return self.audits[ws]

    def _diff(self) -> None:
        """Every (window, record) that is not exactly one row: records with no
        row or several, rows with no record of their window. One hash full join
        of the Kafka records and the target's rows grouped by lineage; every
        lineage check then reads this (normally small) table."""
        try:
            self.conn.execute(f"""
                CREATE TEMP TABLE eos_verify_diff ON COMMIT DROP AS
                SELECT coalesce(k.window_start, r.window_start) AS window_start, coalesce(k.topic, r.topic) AS topic,
                       coalesce(k.partition, r.partition) AS partition, coalesce(k."offset", r."offset") AS "offset",
                       k.window_start IS NOT NULL AS in_kafka, coalesce(r.n, 0) AS n
                FROM eos_verify_records k FULL JOIN (
                    SELECT eos_window_start AS window_start, eos_topic::text AS topic,
                           eos_partition::integer AS partition, eos_offset::bigint AS "offset", count(*) AS n
                    FROM {self.target_sql} WHERE eos_pipeline = %s GROUP BY 1, 2, 3, 4
                ) r ON {_same("k", "r")}
                WHERE k.window_start IS NULL OR r.n IS DISTINCT FROM 1
            """, (self.pipeline,))
        except psycopg.errors.DataError as exc:
            raise TargetError(f"lineage columns of {self.table} do not hold a topic, partition and offset: "
                              f"{exc}") from exc
        self.conn.execute("ANALYZE eos_verify_diff")

    def _count_rows(self) -> None:
        for ws, n in self.conn.execute(
            f"SELECT eos_window_start, count(*) FROM {self.target_sql} WHERE eos_pipeline = %s GROUP BY 1",
            (self.pipeline,),
        ):
            self._audit(ws).published_rows = n
        for ws, n in self.conn.execute(
            "SELECT window_start, count(*) FROM eos.dead_letters WHERE pipeline = %s GROUP BY 1", (self.pipeline,),
        ):
            self._audit(ws).dead_letters = n

    def _examples(self, kind: str, found: str, weight: str = "1") -> Iterator[dict]:
        """Run ``found`` (rows with window_start, topic, partition, offset, ...),
        add each window's total of ``weight`` to the window's ``kind`` counter,
        and yield at most max_examples rows per window; a violation says how
        many more there were."""
        query = f"""
            SELECT * FROM (
                SELECT f.*, sum({weight}) OVER w AS eos_total, count(*) OVER w AS eos_found,
                       row_number() OVER (w ORDER BY topic, partition, "offset") AS eos_rank
                FROM ({found}) f WINDOW w AS (PARTITION BY window_start)
            ) x WHERE eos_rank <= %(limit)s ORDER BY window_start, eos_rank
        """
        with self.conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(query, self._params).fetchall()
        for row in rows:
            if row["eos_rank"] == 1:
                self._count(kind, row["window_start"], int(row["eos_total"]))
                unlisted = row["eos_found"] - self.max_examples
                if unlisted > 0:
                    self.violations.append(Violation(
                        MORE, f"{_at(row['window_start'])}: {unlisted} more {kind} finding(s) not listed",
                        row["window_start"]))
            yield row

    def _count(self, kind: str, ws: datetime | None, n: int) -> None:
        audit = self._audit(ws)
        field_ = {DUPLICATE: "duplicates", DEAD_AND_PUBLISHED: "duplicates", MISSING: "missing", EXTRA: "extra"}[kind]
        setattr(audit, field_, (getattr(audit, field_) or 0) + n)  # None (unknown) becomes a count

    def _add(self, kind: str, row: dict, message: str) -> None:
        self.violations.append(Violation(kind, f"{_at(row['window_start'])}: {message}", row["window_start"],
                                         row["topic"], row["partition"], row["offset"]))

    def _check_lineage(self) -> None:
        for row in self._examples(DUPLICATE, "SELECT * FROM eos_verify_diff WHERE in_kafka AND n > 1",
                                  weight="n - 1"):
            self._add(DUPLICATE, row, f"{_where(row['topic'], row['partition'], row['offset'])} is published "
                                      f"{row['n']} times")

        for row in self._examples(MISSING, """
                SELECT k.* FROM eos_verify_diff k
                JOIN eos.windows w ON w.pipeline = %(p)s AND w.window_start = k.window_start
                WHERE k.in_kafka AND k.n = 0
                  AND NOT EXISTS (SELECT 1 FROM eos.dead_letters d WHERE d.pipeline = %(p)s
                                  AND d.epoch = w.committed_epoch AND """ + _same("d", "k") + ")"):
            self._add(MISSING, row, f"{_where(row['topic'], row['partition'], row['offset'])} is in Kafka but "
                                    "neither published nor a dead letter")

        for row in self._examples(EXTRA, """
                SELECT * FROM eos_verify_diff
                WHERE NOT in_kafka AND coalesce(window_start <> ALL(%(unreadable)s::timestamptz[]), true)""",
                                  weight="n"):
            times = f" ({row['n']} rows)" if row["n"] > 1 else ""
            self._add(EXTRA, row, f"row with lineage {_where(row['topic'], row['partition'], row['offset'])}"
                                  f"{times} {self._why_extra(row)}")

    def _why_extra(self, row: dict) -> str:
        ws, topic, partition, offset = row["window_start"], row["topic"], row["partition"], row["offset"]
        window = self.windows.get(ws)
        if window is None:
            return "is published under a window the pipeline never planned"
        if window.state != "committed":
            return f"is published under a window that is not committed (state {window.state})"
        if topic is None or partition is None or offset is None:
            return "has no complete lineage"
        home = self._home(TopicPartition(topic, partition), offset)
        if home is None:
            return "lies outside every planned window"
        if home.start != ws:
            return f"belongs to {_at(home.start)} ({home.state}), not to this one"
        return "has no record at that offset in Kafka (a transaction marker or a gap)"

    def _home(self, tp: TopicPartition, offset: int) -> _Window | None:
        """The window whose plan holds this offset, if any (windows tile the log)."""
        spans = sorted((r.start_offset, r.end_offset, w.start) for w in self.windows.values()
                       for r in w.ranges if r.tp == tp and r.width)
        i = bisect.bisect_right([s[0] for s in spans], offset) - 1
        if i >= 0 and offset < spans[i][1]:
            return self.windows[spans[i][2]]
        return None

    def _check_dead_letters(self) -> None:
        if self.lineage:
            for row in self._examples(DEAD_AND_PUBLISHED, f"""
                    SELECT d.window_start, d.topic, d.partition, d."offset", d.epoch, count(*) AS n
                    FROM eos.dead_letters d JOIN {self.target_sql} t
                      ON t.eos_pipeline = d.pipeline AND t.eos_window_start = d.window_start
                     AND t.eos_topic::text = d.topic AND t.eos_partition::integer = d.partition
                     AND t.eos_offset::bigint = d."offset"
                    WHERE d.pipeline = %(p)s GROUP BY 1, 2, 3, 4, 5"""):
                self._add(DEAD_AND_PUBLISHED, row, f"{_where(row['topic'], row['partition'], row['offset'])} is a "
                                                   f"dead letter of attempt {row['epoch']} and also published")
        for row in self._examples(EXTRA, """
                SELECT d.window_start, d.topic, d.partition, d."offset", d.epoch, w.state, w.committed_epoch
                FROM eos.dead_letters d LEFT JOIN eos.windows w USING (pipeline, window_start)
                WHERE d.pipeline = %(p)s AND (w.state IS DISTINCT FROM 'committed' OR d.epoch <> w.committed_epoch
                      OR (d.window_start <> ALL(%(unreadable)s::timestamptz[])
                          AND NOT EXISTS (SELECT 1 FROM eos_verify_records k WHERE """ + _same("k", "d") + """)))"""):
            where = _where(row["topic"], row["partition"], row["offset"])
            if row["state"] is None:
                why = "belongs to a window the pipeline never planned"
            elif row["state"] != "committed":
                why = f"belongs to a window that is not committed (state {row['state']})"
            elif row["epoch"] != row["committed_epoch"]:
                why = f"is from attempt {row['epoch']}, but attempt {row['committed_epoch']} committed the window"
            else:
                why = "is not a record of the window in Kafka"
            self._add(EXTRA, row, f"dead letter {where} {why}")

    def _check_aggregates(self) -> None:
        for ws, audit in self.audits.items():
            window = self.windows.get(ws)
            if (window is None or window.state != "committed") and audit.published_rows:
                self._count(EXTRA, ws, audit.published_rows)
                state = "the pipeline never planned" if window is None else f"is not committed (state {window.state})"
                self.violations.append(Violation(EXTRA, f"{_at(ws)}: the target holds {audit.published_rows} row(s) "
                                                        f"under a window that {state}", ws))
        if self.count_column is None:
            return
        column = sql.Identifier(self.count_column).as_string(self.conn).replace("%", "%%")
        counted = dict(self.conn.execute(
            f"SELECT eos_window_start, coalesce(sum({column}), 0) FROM {self.target_sql} WHERE eos_pipeline = %s"
            " GROUP BY 1", (self.pipeline,)).fetchall())
        for ws, window in self.windows.items():
            audit = self.audits[ws]
            if window.state != "committed" or audit.kafka_records is None:
                continue
            dead = self.conn.execute(
                "SELECT count(*) FROM eos.dead_letters WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                (self.pipeline, ws, window.committed_epoch)).fetchone()[0]
            total = int(counted.get(ws, 0)) + dead
            diff = audit.kafka_records - total
            self._count(MISSING, ws, max(diff, 0))
            self._count(EXTRA, ws, max(-diff, 0))
            if diff:
                self.violations.append(Violation(
                    MISSING if diff > 0 else EXTRA,
                    f"{_at(ws)}: {self.count_column} adds up to {total - dead} plus {dead} dead letters = {total}, "
                    f"but Kafka holds {audit.kafka_records} records in the window's ranges", ws))

    def _check_counts(self) -> None:
        for ws, window in self.windows.items():
            if window.state != "committed":
                continue
            audit = self.audits[ws]
            if audit.published_rows != window.published_rows:
                self.violations.append(Violation(
                    COUNT, f"{_at(ws)}: the target holds {audit.published_rows} rows, the ledger recorded "
                           f"{window.published_rows} published by attempt {window.committed_epoch}", ws))
            if audit.dead_letters != window.dead_letter_rows:
                self.violations.append(Violation(
                    COUNT, f"{_at(ws)}: eos.dead_letters holds {audit.dead_letters} rows, the ledger recorded "
                           f"{window.dead_letter_rows} by attempt {window.committed_epoch}", ws))

    def _check_checkpoints(self) -> None:
        checkpoints: dict[tuple[datetime, TopicPartition], tuple[int, int, int]] = {}
        for ws, topic, partition, start, end, records in self.conn.execute(
            "SELECT c.window_start, c.topic, c.partition, c.start_offset, c.end_offset, c.records"
            " FROM eos.checkpoint_ranges c JOIN eos.windows w USING (pipeline, window_start)"
            " WHERE c.pipeline = %s AND w.state = 'committed' AND c.epoch = w.committed_epoch", (self.pipeline,),
        ):
            checkpoints[ws, TopicPartition(topic, partition)] = (start, end, records)
        for ws, window in self.windows.items():
            if window.state != "committed":
                continue
            planned = {r.tp: r for r in window.ranges}
            for (cws, tp), (start, end, records) in checkpoints.items():
                if cws == ws and tp not in planned and end > start:
                    self.violations.append(Violation(
                        CHECKPOINT, f"{_at(ws)}: the checkpoint of attempt {window.committed_epoch} consumed {tp} "
                                    f"[{start}, {end}), which the window does not plan", ws, tp.topic, tp.partition))
            for r in window.ranges:
                got = checkpoints.get((ws, r.tp))
                if got is None:
                    if r.width:
                        self.violations.append(Violation(
                            CHECKPOINT, f"{_at(ws)}: the checkpoint of attempt {window.committed_epoch} has no range "
                                        f"for {r.tp}, planned [{r.start_offset}, {r.end_offset})",
                            ws, r.topic, r.partition))
                    continue
                start, end, records = got
                if (start, end) != (r.start_offset, r.end_offset):
                    self.violations.append(Violation(
                        CHECKPOINT, f"{_at(ws)}: the checkpoint of attempt {window.committed_epoch} consumed {r.tp} "
                                    f"[{start}, {end}), the plan is [{r.start_offset}, {r.end_offset})",
                        ws, r.topic, r.partition))
                present = self.kafka_counts.get((ws, r.tp))
                if present is not None and records != present:
                    self.violations.append(Violation(
                        CHECKPOINT, f"{_at(ws)}: the checkpoint of attempt {window.committed_epoch} counted {records} "
                                    f"records in {r.tp} [{r.start_offset}, {r.end_offset}), Kafka holds {present}",
                        ws, r.topic, r.partition))

    def _check_offsets(self) -> None:
        self.offsets = {TopicPartition(t, p): o for t, p, o in self.conn.execute(
            'SELECT topic, partition, "offset" FROM eos.partition_offsets WHERE pipeline = %s', (self.pipeline,))}
        self.expected = committed_prefix(list(self.windows.values()))
        for tp in sorted(set(self.offsets) | set(self.expected)):
            have, want = self.offsets.get(tp), self.expected.get(tp)
            if have == want:
                continue
            if want is None:
                message = (f"eos.partition_offsets holds {tp} at {have}, but no window of the contiguous "
                           "committed prefix plans that partition")
            elif have is None:
                message = f"eos.partition_offsets has no offset for {tp}; the contiguous committed prefix ends at {want}"
            else:
                message = f"eos.partition_offsets holds {tp} at {have}; the contiguous committed prefix ends at {want}"
            self.violations.append(Violation(OFFSETS, message, None, tp.topic, tp.partition, have))

    @property
    def report(self) -> VerifyReport:
        order = sorted(self.audits.values(), key=lambda a: (a.window_start is None, a.window_start or 0))
        return VerifyReport(self.pipeline, self.table, self.lineage, order, self.offsets, self.expected,
                            self.violations)


def committed_prefix(windows: list) -> dict[TopicPartition, int]:
    """The end offsets of the windows from the earliest one, in time order, up
    to the first that is not committed or does not start where the one before
    ended: what eos.partition_offsets must hold."""
    offsets: dict[TopicPartition, int] = {}
    previous_end = None
    for w in sorted(windows, key=lambda w: w.start):
        if w.state != "committed" or (previous_end is not None and w.start != previous_end):
            break
        for r in w.ranges:
            offsets[r.tp] = r.end_offset
        previous_end = w.end
    return offsets


__all__ = ["verify", "VerifyReport", "WindowAudit", "Totals", "Violation", "committed_prefix"]
