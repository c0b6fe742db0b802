"""The audit's SQL: what ``verify`` compares, in one repeatable-read
transaction of the ledger's database, between the ledger (windows, ranges,
checkpoints, dead letters, offsets), the target's published rows (the relation
its sink gives, see Sink.published_relation) and the records read from Kafka
(eos_verify_records, see verify.kafka). Comparisons run in SQL over temp tables,
so a million records cost seconds, not Python sets. The checks of the ledger's
counts, checkpoints and offsets are verify/ledger_checks.py's, the checks record
by record (lineage, dead letters) verify/lineage.py's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from airflow_eos.core.columns import LINEAGE_COLUMNS
from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable, TargetError
from airflow_eos.core.ledger import Ledger, WindowState, redact
from airflow_eos.core.sink import Sink
from airflow_eos.core.source import PartitionLog
from airflow_eos.core.windows import PartitionRange, TopicPartition
from airflow_eos.verify.foreign import foreign_violations
from airflow_eos.verify.kafka import read_records
from airflow_eos.verify.ledger_checks import (
    checkpoint_violations,
    committed_prefix,
    count_violations,
    offset_violations,
    recorded_offsets,
)
from airflow_eos.verify.lineage import LineageChecks
from airflow_eos.verify.report import (
    DEAD_AND_PUBLISHED,
    DUPLICATE,
    EXTRA,
    MISSING,
    MORE,
    UNPUBLISHED,
    NotCheckable,
    VerifyReport,
    Violation,
    WindowAudit,
    _at,
    _Window,
)


class _Audit(LineageChecks):
    def __init__(self, conn: psycopg.Connection, ledger: Ledger, pipeline: str, table: str, sink: Sink,
                 count_column: str | None, max_examples: int, max_timestamp_skew: timedelta):
        self.conn = conn
        self.ledger = ledger
        self.pipeline = pipeline
        self.table = table  # the target as messages name it
        self.sink = sink
        self.target_sql = ""  # the sink's relation of published rows, as SQL text (see _describe_target)
        self.count_column = count_column
        self.max_examples = max(1, max_examples)
        self.max_timestamp_skew = max_timestamp_skew
        self.windows: dict[datetime, _Window] = {}
        self.unreadable: set[datetime] = set()
        self.compacted: set[tuple[datetime, TopicPartition]] = set()  # committed ranges of compacted topics
        self.expired: list[NotCheckable] = []  # offsets of committed ranges retention deleted since
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
        self._check_unpublished()
        self._check_unattributed()

    def _check_unattributed(self) -> None:
        """What readers of the whole target see that no committed window of
        this pipeline accounts for (Sink.unattributed): FOREIGN violations,
        their rows counted as extra rows without a window."""
        topics = sorted({r.topic for w in self.windows.values() for r in w.ranges})
        violations, rows = foreign_violations(self.sink, self.conn, self.pipeline, topics, self.table,
                                              self.max_examples)
        self.violations += violations
        if rows:
            self._count(EXTRA, None, rows)

    def _check_unpublished(self) -> None:
        """Windows decided and never published: committed in the ledger, the
        offsets past them, and not in the target (their records then also
        show as missing)."""
        for ws, epoch in sorted(self.ledger.unpublished_windows(self.conn, self.pipeline).items()):
            self._audit(ws).unpublished = True
            self.violations.append(Violation(
                UNPUBLISHED, f"{_at(ws)}: decided, not published: attempt {epoch} is committed in the ledger (the "
                             f"pipeline's offsets advanced past it) but its publication never reached {self.table}, "
                             "so readers do not see it. The commit task's log says why; fix that, then retry the "
                             "commit task or clear the run", ws))

    def _describe_target(self) -> None:
        """The target's published rows as its sink gives them, and which of the
        lineage and count columns they have."""
        wanted = () if self.count_column is None else (self.count_column,)
        relation = self.sink.published_relation(self.conn, self.pipeline, wanted)
        # psycopg reads any % in a query's text as a placeholder, even inside a quoted identifier.
        self.target_sql = relation.as_string(self.conn).replace("%", "%%")
        described = self.conn.execute(sql.SQL("SELECT * FROM {} t LIMIT 0").format(relation)).description
        columns = {c.name for c in described}
        if self.count_column is not None and self.count_column not in columns:
            raise TargetError(f"target table {self.table} has no column {self.count_column!r} (count_column)")
        self.lineage = all(c in columns for c in LINEAGE_COLUMNS)

    def read_kafka(self, kafka: PartitionLog | Mapping[str, Any], timeout: float) -> None:
        """The records of every committed window's ranges, into eos_verify_records
        (see verify.kafka.read_records), and each window's count of them."""
        read = read_records(self.conn, self.windows, kafka, timeout, self.max_timestamp_skew)
        self.kafka_counts, self.unreadable, self.compacted = read.counts, read.unreadable, read.compacted
        self.expired = read.expired
        self.violations += read.violations
        self.conn.execute("ANALYZE eos_verify_records")  # autovacuum never analyses temp tables
        for w in self.windows.values():
            counts = [self.kafka_counts.get((w.start, r.tp)) for r in w.ranges]
            if w.state == WindowState.COMMITTED and None not in counts:  # else not all of it could be read
                self.audits[w.start].kafka_records = sum(counts)

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
        self._check_ledger()

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

    def _count_rows(self) -> None:
        for ws, n in self.conn.execute(
            f"SELECT eos_window_start, count(*) FROM {self.target_sql} t WHERE eos_pipeline = %s GROUP BY 1",
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

    def _check_aggregates(self) -> None:
        for ws, audit in self.audits.items():
            window = self.windows.get(ws)
            if (window is None or window.state != WindowState.COMMITTED) and audit.published_rows:
                self._count(EXTRA, ws, audit.published_rows)
                state = "the pipeline never planned" if window is None else f"is not committed (state {window.state})"
                self.violations.append(Violation(EXTRA, f"{_at(ws)}: the target holds {audit.published_rows} row(s) "
                                                        f"under a window that {state}", ws))
        if self.count_column is None:
            return
        column = sql.Identifier(self.count_column).as_string(self.conn).replace("%", "%%")
        counted = dict(self.conn.execute(
            f"SELECT eos_window_start, coalesce(sum({column}), 0) FROM {self.target_sql} t WHERE eos_pipeline = %s"
            " GROUP BY 1", (self.pipeline,)).fetchall())
        for ws, window in self.windows.items():
            audit = self.audits[ws]
            if window.state != WindowState.COMMITTED or audit.kafka_records is None:
                continue
            dead = self.conn.execute(
                "SELECT count(*) FROM eos.dead_letters WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                (self.pipeline, ws, window.committed_epoch)).fetchone()[0]
            total = int(counted.get(ws, 0)) + dead
            diff = audit.kafka_records - total
            if diff < 0 and any((ws, r.tp) in self.compacted for r in window.ranges):
                diff = 0  # records the cleaner removed since the window read them
            self._count(MISSING, ws, max(diff, 0))
            self._count(EXTRA, ws, max(-diff, 0))
            if diff:
                self.violations.append(Violation(
                    MISSING if diff > 0 else EXTRA,
                    f"{_at(ws)}: {self.count_column} adds up to {total - dead} plus {dead} dead letters = {total}, "
                    f"but Kafka holds {audit.kafka_records} records in the window's ranges", ws))

    def _check_ledger(self) -> None:
        """The ledger against itself and what was read (verify.ledger_checks)."""
        self.violations += count_violations(self.windows, self.audits)
        self.violations += checkpoint_violations(self.conn, self.pipeline, self.windows, self.kafka_counts,
                                                 self.compacted)
        self.offsets = recorded_offsets(self.conn, self.pipeline)
        self.expected = committed_prefix(self.windows.values())
        self.violations += offset_violations(self.offsets, self.expected)

    @property
    def report(self) -> VerifyReport:
        order = sorted(self.audits.values(), key=lambda a: (a.window_start is None, a.window_start or 0))
        return VerifyReport(self.pipeline, self.table, self.lineage, order, self.offsets, self.expected,
                            self.violations, not_checkable=self.expired)
