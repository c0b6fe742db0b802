"""The ledger's schema is created and upgraded by the code, safely in parallel."""

from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from harness.concurrency import at_once

from airflow_eos.core.ledger import Ledger
from airflow_eos.core.migrations import LATEST_VERSION, MIGRATIONS


def test_migrations_are_idempotent_and_safe_under_concurrent_callers(pg_url):
    ledger = Ledger(pg_url)
    assert at_once([ledger.migrate] * 8) == [(LATEST_VERSION, None)] * 8  # each call's (result, error)
    assert ledger.migrate() == LATEST_VERSION
    with psycopg.connect(pg_url) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM eos.schema_version ORDER BY version")]
        tables = {t for (t,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'eos'")}
    assert versions == list(range(1, LATEST_VERSION + 1))
    assert {"pipelines", "cuts", "windows", "window_ranges", "attempts", "checkpoint_ranges",
            "partition_offsets"} <= tables


def test_a_pipeline_planned_before_claims_were_recorded_is_adopted_by_its_next_plan(
        pg_url, kafka_config, topics, monkeypatch):
    """Migration 5 on a ledger whose pipeline was planned by an airflow-eos
    without claims: its row has no claim, and its next plan (here of the window
    already frozen) claims it instead of being refused; after that the claim
    holds as for any pipeline."""
    import airflow_eos.core.ledger as ledger_module
    from airflow_eos.core.errors import OwnershipConflict
    from airflow_eos.core.plan import PlanRequest, plan_window
    from airflow_eos.core.source import KafkaLog
    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan, to_millis

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    hour = timedelta(hours=1)
    topic = topics.create()
    topics.produce(topic, [(0, to_millis(t0) + i * 60_000, b"x") for i in range(150)])
    ledger = Ledger(pg_url)
    with monkeypatch.context() as old:  # the ledger as airflow-eos before migration 5 left it
        old.setattr(ledger_module, "MIGRATIONS", MIGRATIONS[:4])
        old.setattr(ledger_module, "LATEST_VERSION", 4)
        assert ledger.migrate() == 4
        frozen = WindowPlan(Window("legacy", t0, t0 + hour), (PartitionRange(topic, 0, 0, 60),))
        with ledger.connect() as conn, conn.transaction():
            ledger.lock_pipeline(conn, "legacy")
            ledger.freeze(conn, frozen, [])
    assert ledger.migrate() == LATEST_VERSION >= 5  # migration 5 and those after it
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT pipeline, dag_id, topics, target FROM eos.pipelines").fetchall() == [
            ("legacy", None, None, None)]

    def plan(start, dag_id):
        request = PlanRequest(Window("legacy", start, start + hour), (topic,), timedelta(0), dag_id=dag_id,
                              target_id="postgresql:analytics.orders")
        with KafkaLog(kafka_config) as log_:
            return plan_window(ledger, log_, request, now=lambda: t0 + timedelta(days=1))

    assert plan(t0, "orders_hourly") == frozen  # adopted, not refused
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT dag_id, topics, target, claimed_at IS NOT NULL FROM eos.pipelines").fetchall() \
            == [("orders_hourly", [topic], "postgresql:analytics.orders", True)]
    with pytest.raises(OwnershipConflict, match="two DAGs share pipeline id 'legacy'"):
        plan(t0 + hour, "orders_copy")
    assert [(r.start_offset, r.end_offset) for r in plan(t0 + hour, "orders_hourly").ranges] == [(60, 120)]


def test_attempt_and_window_states_are_stored_as_their_text(pg_url):
    """AttemptState and WindowState members are str: psycopg binds each as its
    value (text and binary, prepared or not), the ledger's CHECK constraints
    accept them, and what is read back equals them and prints as the value."""
    from airflow_eos.core import attempt as attempts
    from airflow_eos.core.attempt import ABORTED, COMMITTED, LIVE, AttemptState
    from airflow_eos.core.ledger import WindowState
    from airflow_eos.core.windows import Window, WindowPlan

    assert (str(COMMITTED), f"{COMMITTED}", "%s" % COMMITTED) == ("committed",) * 3
    assert (str(WindowState.PLANNED), f"{WindowState.PLANNED}") == ("planned",) * 2
    assert [s.value for s in LIVE] == ["open", "checkpointed", "prepared"]
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TEMP TABLE s (state text)")
        conn.execute("INSERT INTO s VALUES (%s), (%s)", (AttemptState.COMMITTED, WindowState.PLANNED))
        conn.execute("UPDATE s SET state = %s WHERE state = %s", (ABORTED, WindowState.PLANNED), prepare=True)
        with conn.cursor(binary=True) as cur:
            cur.execute("INSERT INTO s VALUES (%s)", (AttemptState.OPEN,))
        conn.execute("INSERT INTO s SELECT unnest(%s::text[])", (list(LIVE),))
        assert [s for (s,) in conn.execute("SELECT state FROM s ORDER BY 1")] == \
            ["aborted", "checkpointed", "committed", "open", "open", "prepared"]

    ledger = Ledger(pg_url)
    ledger.migrate()
    window = Window("p", datetime(2024, 1, 1, tzinfo=timezone.utc), datetime(2024, 1, 1, 1, tzinfo=timezone.utc))
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, window.pipeline)
        ledger.freeze(conn, WindowPlan(window, ()), [])
        attempt = attempts.open_attempt(conn, window)
        assert attempts.mark_aborted(conn, attempt, "test")
        status = attempts.load_status(conn, attempt)
        stored = conn.execute("SELECT a.state, w.state FROM eos.attempts a JOIN eos.windows w"
                              " USING (pipeline, window_start)").fetchall()
    assert stored == [("aborted", "planned")]
    assert (status.state, status.window_state) == (AttemptState.ABORTED, WindowState.PLANNED)
    assert type(status.state) is AttemptState and type(status.window_state) is WindowState
