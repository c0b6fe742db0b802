"""The ledger's schema is created and upgraded by the code, safely in parallel."""

import threading

import psycopg

from airflow_eos.core.ledger import Ledger
from airflow_eos.core.migrations import LATEST_VERSION


def test_migrations_are_idempotent_and_safe_under_concurrent_callers(pg_url):
    ledger = Ledger(pg_url)
    barrier = threading.Barrier(8)
    results, errors = [], []

    def migrate():
        barrier.wait()
        try:
            results.append(ledger.migrate())
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [LATEST_VERSION] * 8
    assert ledger.migrate() == LATEST_VERSION
    with psycopg.connect(pg_url) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM eos.schema_version ORDER BY version")]
        tables = {t for (t,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'eos'")}
    assert versions == list(range(1, LATEST_VERSION + 1))
    assert {"pipelines", "cuts", "windows", "window_ranges", "attempts", "checkpoint_ranges",
            "partition_offsets"} <= tables
