"""The audit's checks record by record: where the target's rows carry their lineage
(topic, partition, offset), every (window, record) that is not exactly one row and
every dead letter also published; on any target, every dead letter that is not a
record of its window's committed attempt. Mixed into the audit (verify/audit.py),
whose state they read and whose findings they add to."""

from __future__ import annotations

import bisect
from datetime import datetime

import psycopg

from airflow_eos.core.errors import TargetError
from airflow_eos.core.ledger import WindowState
from airflow_eos.core.windows import TopicPartition
from airflow_eos.verify.report import DEAD_AND_PUBLISHED, DUPLICATE, EXTRA, MISSING, _at, _where, _Window

# Same window and same record: rows, Kafka records and dead letters are joined on these.
_SAME_RECORD = ("{a}.window_start = {b}.window_start AND {a}.topic = {b}.topic AND {a}.partition = {b}.partition"
                ' AND {a}."offset" = {b}."offset"')


def _same(a: str, b: str) -> str:
    return _SAME_RECORD.format(a=a, b=b)


def _in_span(spans: str, a: str) -> str:
    """SQL: {a}'s offset lies in one of its window's spans in the temp table
    ``spans`` (window_start, topic, partition, start_offset, end_offset)."""
    return (f"EXISTS (SELECT 1 FROM {spans} c WHERE c.window_start = {a}.window_start"
            f' AND c.topic = {a}.topic AND c.partition = {a}.partition AND {a}."offset" >= c.start_offset'
            f' AND {a}."offset" < c.end_offset)')


def _in_compacted(a: str) -> str:
    """SQL: {a}'s offset is in its window's range of a compacted topic (the cleaner may have removed its record)."""
    return _in_span("eos_verify_compacted", a)


def _in_expired(a: str) -> str:
    """SQL: {a}'s offset is in its window's offsets retention has deleted since (no record to compare it with)."""
    return _in_span("eos_verify_expired", a)


class LineageChecks:
    """The record-by-record checks of ``_Audit``: the audit's connection, pipeline, target
    (``table`` as messages name it, ``target_sql`` the relation of its published rows) and
    windows, and its ``_examples`` and ``_add`` for what they find."""

    conn: psycopg.Connection
    pipeline: str
    table: str
    target_sql: str
    windows: dict[datetime, _Window]

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
                    FROM {self.target_sql} t WHERE eos_pipeline = %s GROUP BY 1, 2, 3, 4
                ) r ON {_same("k", "r")}
                WHERE k.window_start IS NULL OR r.n IS DISTINCT FROM 1
            """, (self.pipeline,))
        except psycopg.errors.DataError as exc:
            raise TargetError(f"lineage columns of {self.table} do not hold a topic, partition and offset: "
                              f"{exc}") from exc
        self.conn.execute("ANALYZE eos_verify_diff")

    def _check_lineage(self) -> None:
        # A row whose record the cleaner removed since its window read it, or
        # retention deleted, is no extra row (the window's counts still match
        # the ledger's), but published twice it is still a duplicate.
        gone = f'({_in_compacted("eos_verify_diff")} OR {_in_expired("eos_verify_diff")})'
        for row in self._examples(DUPLICATE, f"SELECT * FROM eos_verify_diff WHERE n > 1 AND (in_kafka OR {gone})",
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

        for row in self._examples(EXTRA, f"""
                SELECT * FROM eos_verify_diff
                WHERE NOT in_kafka AND coalesce(window_start <> ALL(%(unreadable)s::timestamptz[]), true)
                  AND NOT {gone}""", weight="n"):
            times = f" ({row['n']} rows)" if row["n"] > 1 else ""
            self._add(EXTRA, row, f"row with lineage {_where(row['topic'], row['partition'], row['offset'])}"
                                  f"{times} {self._why_extra(row)}")

    def _why_extra(self, row: dict) -> str:
        ws, topic, partition, offset = row["window_start"], row["topic"], row["partition"], row["offset"]
        window = self.windows.get(ws)
        if window is None:
            return "is published under a window the pipeline never planned"
        if window.state != WindowState.COMMITTED:
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
                          AND NOT EXISTS (SELECT 1 FROM eos_verify_records k WHERE """ + _same("k", "d") + """)
                          AND NOT """ + _in_compacted("d") + " AND NOT " + _in_expired("d") + "))"):
            where = _where(row["topic"], row["partition"], row["offset"])
            if row["state"] is None:
                why = "belongs to a window the pipeline never planned"
            elif row["state"] != WindowState.COMMITTED:
                why = f"belongs to a window that is not committed (state {row['state']})"
            elif row["epoch"] != row["committed_epoch"]:
                why = f"is from attempt {row['epoch']}, but attempt {row['committed_epoch']} committed the window"
            else:
                why = "is not a record of the window in Kafka"
            self._add(EXTRA, row, f"dead letter {where} {why}")
