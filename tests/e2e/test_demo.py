"""``airflow-eos demo``'s story (airflow_eos/demo.py) on this session's PostgreSQL
and a broker of its own: four hourly windows through real Airflow on the demo's
warm Spark Connect server, Spark's Python workers crashing mid-COPY on both tries
of one window, its Clear, the Clear of a committed window, the audit. Checked by
lineage and the ledger, not by the CLI tables the demo prints."""

from __future__ import annotations

import re
import psycopg
import pytest

from airflow_eos import demo
from airflow_eos.core.ledger import Ledger
from airflow_eos.embedded import KafkaBroker
from airflow_eos.targets.postgres.target import PostgresTarget
from airflow_eos.verify import verify

pytestmark = pytest.mark.slow


def test_the_demo_commits_every_window_once_through_a_worker_crash_and_two_clears(pg_url, tmp_path, capsys):
    with KafkaBroker() as broker:
        code = demo.run_demo(pg_url, broker.bootstrap, tmp_path)
        out = capsys.readouterr().out
        with capsys.disabled():
            print(out)  # the demo's own lines, with each step's elapsed time
        assert code == 0, out
        report = verify(Ledger(pg_url), {"bootstrap.servers": broker.bootstrap},
                        PostgresTarget(pg_url, "analytics.orders"), "orders_hourly")
    assert report.clean, str(report)

    # Every record of the four hours is published once or is a dead letter; nothing else.
    assert report.committed_windows == demo.HOURS
    per_window = demo.ORDERS_PER_HOUR
    records = [per_window + (40 if h == demo.HOURS - 1 else 0) for h in range(demo.HOURS)]  # the late ones last
    assert [w.published_rows + w.dead_letters for w in report.windows] == records
    assert sum(w.dead_letters for w in report.windows) == per_window * demo.HOURS // 100  # 1 % malformed
    assert [(w.duplicates, w.missing, w.extra) for w in report.windows] == [(0, 0, 0)] * demo.HOURS
    with psycopg.connect(pg_url) as conn:
        rows, distinct = conn.execute("SELECT count(*), count(DISTINCT (eos_topic, eos_partition, eos_offset))"
                                      " FROM analytics.orders").fetchone()
        attempts = conn.execute("SELECT window_start, epoch, state FROM eos.attempts ORDER BY 1, 2").fetchall()
        staging = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'").fetchone()[0]
    assert rows == distinct == sum(w.published_rows for w in report.windows)
    assert staging == 0

    # The crashed window: each of the failed run's two tries opened an attempt that
    # the crash failed and abort cleaned up; the Clear's attempt committed. Every
    # other window, the cleared committed one included, has its one attempt.
    crashed_start = demo.T0 + demo.CRASHED_WINDOW * demo.HOUR
    by_window = {}
    for start, epoch, state in attempts:
        by_window.setdefault(start, []).append((epoch, state))
    assert by_window.pop(crashed_start) == [(1, "aborted"), (2, "aborted"), (3, "committed")], attempts
    assert list(by_window.values()) == [[(1, "committed")]] * (demo.HOURS - 1), attempts
    assert sorted(by_window) == [demo.T0 + h * demo.HOUR for h in range(demo.HOURS) if h != demo.CRASHED_WINDOW]

    # The crashes were real: Spark's Python workers on the server died at the fault point.
    spark_log = (tmp_path / "spark-connect.log").read_text(errors="replace")
    assert spark_log.count("fault injected at stage.mid_write: crashing") >= 2, spark_log[-3000:]
    crashed = re.search(r"run failed; (\d+) workers crashed", out)
    assert crashed and int(crashed.group(1)) >= 2, out
    # Each window's line says how long it took (the demo's point is its speed).
    assert len(re.findall(r"window \[\d\d:00, \d\d:00\).* run \w+.*\(\d+\.\ds\)$", out, re.M)) == demo.HOURS + 2, out
