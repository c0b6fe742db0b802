"""orders_hourly under a live Airflow stack (api-server, dag-processor,
scheduler with the LocalExecutor): a real backfill of six hourly windows with
three runs at a time, clears through the REST API as the UI sends them, two
windows failing mid-commit, one rerun by a clear through the REST API and one
by the user's Clear in the real UI in a browser, the window status page (the
package's plugin) and the grid view, both in headless Chromium driven by
Selenium. Exactly-once is checked on the ledger (the windows tile every
partition) and by lineage with the auditor.

The stage tasks run their Spark job on the worker's warm Spark Connect server,
as the compose deployment does (tests/e2e/conftest.py): what these tests are
about is the scheduler's, the API's and the UI's part. The example DAGs'
spark-submit through Airflow is the other e2e modules' (dag.test).

One stack for the module (starting it costs ~30 s); the tests run in file order
and each builds on the state the previous ones left, as an operator would.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
import zlib
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from airflow_eos import PostgresTarget
from airflow_eos.core.ledger import Ledger
from airflow_eos.verify import verify
from airflow_eos.core.windows import to_millis
from harness import browser as ui
from harness.airflow_stack import airflow_stack, postgres_database
from harness.topics import recreate_topic

# Correctness first: on a 2-core machine shared with other Spark work, a window's
# stage can take minutes, so the waits are generous.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "orders_hourly"
GROUP = "window"
T0 = datetime(2026, 3, 2, tzinfo=UTC)  # after the DAG's start_date, long past
HOUR = timedelta(hours=1)
HOURS = 8  # records in 8 windows: 6 for the backfill, the 7th and 8th fail (cleared by REST, by the UI)
BACKFILLED = 6
PER_HOUR = 200
PARTITIONS = 4
FAULT = "commit.after_publish"
FAILING = 2  # windows failing mid-commit
FAULT_TRIES = 2 * FAILING  # orders_hourly retries a task once: both tries of each failing commit fail


def produce_orders(bootstrap: str) -> dict[int, int]:
    """Order events in HOURS hourly windows from T0 (every 50th malformed: a dead
    letter), then one record per partition after the last window so it closes.
    Returns the number of records per window."""
    recreate_topic(bootstrap, "orders", PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    per_window: dict[int, int] = {}
    for h in range(HOURS):
        for i in range(PER_HOUR):
            n = h * PER_HOUR + i
            value = b"{not json" if n % 50 == 7 else json.dumps(
                {"order_id": f"o-{n}", "customer": f"c-{n % 13}", "amount": round(n * 0.37, 2)}).encode()
            producer.produce("orders", value=value, partition=n % PARTITIONS,
                             timestamp=to_millis(T0 + h * HOUR) + i * (3_600_000 // PER_HOUR))
            per_window[h] = per_window.get(h, 0) + 1
    for p in range(PARTITIONS):
        producer.produce("orders", value=json.dumps({"order_id": f"late-{p}", "customer": "x", "amount": 1}).encode(),
                         partition=p, timestamp=to_millis(T0 + HOURS * HOUR) + 1000)
    assert producer.flush(30) == 0
    return per_window


@pytest.fixture(scope="module")
def live(pg_server, kafka, connect_server, tmp_path_factory):
    """The stack, with a target database and the orders topic of this module.

    ``EOS_FAULTS`` reaches every task process through the scheduler's
    environment. It is disarmed until a test arms it: faults.py counts the
    firings of ``point=raise*N`` by creating ``point.0`` … ``point.N-1`` in
    ``EOS_FAULTS_STATE``, so with those files in place nothing fires, and
    removing them arms exactly N firings."""
    fault_state = tmp_path_factory.mktemp("faults")
    for n in range(FAULT_TRIES):
        (fault_state / f"{FAULT}.{n}").touch()
    with postgres_database(pg_server.address, prefix="eos_live_target") as target_url, \
            postgres_database(pg_server.address, prefix="eos_live_airflow") as metadata_url:
        from airflow_eos.examples.transforms import ORDERS_TABLE_DDL

        # Concurrent first runs would race on CREATE SCHEMA IF NOT EXISTS in create_table
        # (PostgreSQL's catalog unique index); an existing table makes that task a no-op.
        with psycopg.connect(target_url, autocommit=True) as conn:
            conn.execute(ORDERS_TABLE_DDL)
        per_window = produce_orders(kafka.address)
        pg = psycopg.conninfo.conninfo_to_dict(target_url)
        connections = {
            "kafka_default": {"conn_type": "kafka",
                              "extra": {"bootstrap.servers": kafka.address, "fetch.wait.max.ms": 10}},
            "postgres_default": {"conn_type": "postgres", "host": pg["host"], "port": int(pg["port"]),
                                 "login": pg["user"], "schema": pg["dbname"], "password": pg.get("password")},
            "spark_default": {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect_server.port},
        }
        home = Path(tempfile.mkdtemp(prefix="eos-live-airflow-"))
        try:
            with airflow_stack(home, dags_folder=ROOT / "dags", metadata_url=metadata_url, connections=connections,
                               parallelism=4,
                               min_file_process_interval=900,
                               env={"EOS_FAULTS": f"{FAULT}=raise*{FAULT_TRIES}",
                                    "EOS_FAULTS_STATE": str(fault_state)}) as stack:
                stack.client.wait_for_dag(DAG_ID)
                stack.client.unpause(DAG_ID)  # backfill runs of a paused DAG wait
                yield Live(stack, target_url, {"bootstrap.servers": kafka.address}, per_window, fault_state)
        finally:
            for f in AdminClient({"bootstrap.servers": kafka.address}).delete_topics(["orders"]).values():
                try:
                    f.result(15)
                except Exception:  # noqa: BLE001 - best effort: the next test recreates it anyway
                    pass
            if not os.environ.get("EOS_KEEP_AIRFLOW_HOME"):  # keep logs for a post-mortem
                shutil.rmtree(home, ignore_errors=True)


class Live:
    def __init__(self, stack, target_url, kafka_config, per_window, fault_state):
        self.stack = stack
        self.client = stack.client
        self.target_url = target_url
        self.kafka_config = kafka_config
        self.per_window = per_window
        self.fault_state = fault_state

    def sql(self, query, *args):
        with psycopg.connect(self.target_url) as conn:
            return conn.execute(query, args).fetchall()

    def audit(self):
        report = verify(Ledger(self.target_url), self.kafka_config,
                        PostgresTarget(self.target_url, "analytics.orders"), DAG_ID)
        assert report.clean, str(report)
        return report

    def run_of(self, h: int) -> dict:
        """The DAG run of window h (data interval [T0 + h, T0 + h + 1))."""
        start = T0 + h * HOUR
        runs = [r for r in self.client.dag_runs(DAG_ID)
                if datetime.fromisoformat(r["data_interval_start"]) == start]
        assert len(runs) == 1, runs
        return runs[0]

    def explain(self, run_id: str) -> str:
        """Task states and the failed tries' log tails, for assertion messages."""
        tis = self.client.task_instances(DAG_ID, run_id)
        out = [f"{ti['task_id']}: {ti['state']} (try {ti['try_number']})" for ti in tis]
        for ti in tis:
            if ti["state"] in ("failed", "upstream_failed", "up_for_retry"):
                text = self.stack.task_log(DAG_ID, run_id, ti["task_id"], ti["try_number"])
                out.append(f"--- {ti['task_id']} try {ti['try_number']}\n{text[-3000:]}")
                if ti.get("id"):  # the scheduler's and the API server's word on this try
                    out.append(self.stack.lines_with(ti["id"]))
        if len(out) > len(tis):  # a task failed: what the scheduler and the API server said around it
            out.append(self.stack.tail(lines=80))
        return "\n".join(out)


def tiling(live: Live) -> dict[int, list[tuple[datetime, int, int]]]:
    """Each partition's planned ranges, in window order."""
    by_partition: dict[int, list] = {}
    for partition, start, lo, hi in live.sql(
            "SELECT partition, window_start, start_offset, end_offset FROM eos.window_ranges"
            " WHERE pipeline = %s ORDER BY partition, window_start", DAG_ID):
        by_partition.setdefault(partition, []).append((start, lo, hi))
    return by_partition


# --------------------------------------------------------------------------- (a) backfill


@pytest.fixture(scope="module")
def backfilled(live):
    """``airflow backfill create`` of the first six windows, three runs at a time."""
    started = time.monotonic()
    live.stack.airflow("backfill", "create", "--dag-id", DAG_ID, "--from-date", T0.isoformat(),
                       "--to-date", (T0 + (BACKFILLED - 1) * HOUR).isoformat(), "--max-active-runs", "3")
    try:
        runs = live.client.wait_for_runs(DAG_ID, BACKFILLED, timeout=1200, run_type=["backfill"])
    except TimeoutError as exc:
        unfinished = [r["dag_run_id"] for r in live.client.dag_runs(DAG_ID) if r["state"] not in ("success",)]
        raise TimeoutError(f"{exc}\n" + "\n".join(live.explain(run_id) for run_id in unfinished)) from None
    live.backfill_seconds = time.monotonic() - started
    print(f"\nbackfill of {BACKFILLED} windows: {live.backfill_seconds:.0f}s\n" + task_timings(live, runs))
    return runs


def task_timings(live: Live, runs: list[dict]) -> str:
    """Mean seconds per task: queued → started, started → ended (where time goes)."""
    waits: dict[str, list[float]] = {}
    durations: dict[str, list[float]] = {}
    for run in runs:
        for ti in live.client.task_instances(DAG_ID, run["dag_run_id"]):
            if ti.get("queued_when") and ti.get("start_date"):
                waits.setdefault(ti["task_id"], []).append(
                    (datetime.fromisoformat(ti["start_date"]) - datetime.fromisoformat(ti["queued_when"]))
                    .total_seconds())
            if ti.get("duration") is not None:
                durations.setdefault(ti["task_id"], []).append(ti["duration"])
    return "\n".join(f"  {task:<24} queued {sum(waits.get(task, [0])) / max(1, len(waits.get(task, []))):5.1f}s"
                     f"  ran {sum(d) / len(d):5.1f}s" for task, d in durations.items())


def test_backfill_commits_every_window_once_without_gap_or_overlap(live, backfilled):
    runs = sorted(backfilled, key=lambda r: r["data_interval_start"])
    assert [datetime.fromisoformat(r["data_interval_start"]) for r in runs] == \
        [T0 + h * HOUR for h in range(BACKFILLED)]
    failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
    assert not failed, "\n".join(live.explain(run_id) for run_id in failed)
    backfill = live.client.backfills(DAG_ID)[0]
    assert backfill["max_active_runs"] == 3

    # the ledger: six windows, each committed once by its first attempt
    windows = live.sql("SELECT window_start, window_end, state, committed_epoch FROM eos.windows"
                       " WHERE pipeline = %s ORDER BY window_start", DAG_ID)
    assert [(s, e, state, epoch) for s, e, state, epoch in windows] == \
        [(T0 + h * HOUR, T0 + (h + 1) * HOUR, "committed", 1) for h in range(BACKFILLED)]
    assert live.sql("SELECT count(*), count(*) FILTER (WHERE state = 'committed') FROM eos.attempts") == \
        [(BACKFILLED, BACKFILLED)]

    # ... whose ranges tile every partition: from its first offset, no gap, no overlap,
    # up to the first record of the seventh window
    ranges = tiling(live)
    assert sorted(ranges) == list(range(PARTITIONS))
    per_partition_window = PER_HOUR // PARTITIONS
    for partition, rs in ranges.items():
        assert [start for start, _, _ in rs] == [T0 + h * HOUR for h in range(BACKFILLED)]
        assert rs[0][1] == 0, (partition, rs)
        assert all(a[2] == b[1] for a, b in pairwise(rs)), (partition, rs)
        assert [hi - lo for _, lo, hi in rs] == [per_partition_window] * BACKFILLED, (partition, rs)
    offsets = dict(live.sql('SELECT partition, "offset" FROM eos.partition_offsets WHERE pipeline = %s', DAG_ID))
    assert offsets == {p: BACKFILLED * per_partition_window for p in range(PARTITIONS)}

    # ... and the auditor agrees, record by record, with Kafka
    report = live.audit()
    produced = sum(live.per_window[h] for h in range(BACKFILLED))
    assert report.committed_windows == BACKFILLED
    assert report.totals.kafka_records == produced
    assert report.totals.published_rows + report.totals.dead_letters == produced
    assert live.sql("SELECT count(*) FROM analytics.orders") == [(report.totals.published_rows,)]
    print(report)


# --------------------------------------------------------------------------- (b) clear a committed window


def test_clearing_a_committed_windows_group_through_the_api_skips_it(live, backfilled, failing_window):
    """Meanwhile the seventh window runs and fails next to it (see failing_window)."""
    h = 2
    run = live.run_of(h)
    earlier = "SELECT * FROM analytics.orders WHERE eos_window_start < %s ORDER BY eos_partition, eos_offset"
    before = live.sql(earlier, T0 + BACKFILLED * HOUR)
    offsets_before = live.sql('SELECT topic, partition, "offset" FROM eos.partition_offsets ORDER BY 1, 2')

    cleared = live.client.clear_task_group(DAG_ID, run["dag_run_id"], GROUP)
    assert {ti["task_id"] for ti in cleared} == {f"{GROUP}.{t}" for t in
                                                  ("plan", "stage", "await_checkpoint", "commit", "abort")}
    rerun = live.client.wait_for_run(DAG_ID, run["dag_run_id"], timeout=600)
    assert rerun["state"] == "success", live.explain(run["dag_run_id"])
    assert live.client.ti_states(DAG_ID, run["dag_run_id"])["create_table"] == "success"  # not rerun

    # No attempt, no Spark job: the stage says who committed the window, the rest is skipped (no Asset event).
    summary = live.client.xcom(DAG_ID, run["dag_run_id"], f"{GROUP}.stage")
    assert (summary["outcome"], summary["committed_epoch"], summary["epoch"]) == ("skipped", 1, None)
    ti_states = live.client.ti_states(DAG_ID, run["dag_run_id"])
    assert (ti_states[f"{GROUP}.stage"], ti_states[f"{GROUP}.commit"]) == ("skipped", "skipped"), ti_states
    assert live.sql(earlier, T0 + BACKFILLED * HOUR) == before
    assert live.sql('SELECT topic, partition, "offset" FROM eos.partition_offsets ORDER BY 1, 2') == offsets_before
    attempts = live.sql("SELECT epoch, state FROM eos.attempts WHERE window_start = %s ORDER BY epoch",
                        T0 + h * HOUR)
    assert attempts == [(1, "committed")]
    assert live.audit().committed_windows == BACKFILLED


# --------------------------------------------------------------------------- (c) a window that failed


@pytest.fixture(scope="module")
def failing_window(live, backfilled):
    """A backfill of the seventh and eighth windows with the fault armed: both
    tries of each commit fail inside the commit transaction. Started, not
    awaited, so that they run while the previous test clears another window.
    Returns the first failing window's index."""
    h = BACKFILLED
    for n in range(FAULT_TRIES):
        (live.fault_state / f"{FAULT}.{n}").unlink()
    for backfill in live.client.backfills(DAG_ID):  # one running backfill per DAG
        live.client.wait_for_backfill(backfill["id"], timeout=60)
    live.client.create_backfill(DAG_ID, T0 + h * HOUR, T0 + (h + FAILING - 1) * HOUR, max_active_runs=FAILING)
    return h


@pytest.fixture(scope="module")
def failed_windows(live, failing_window):
    """Both failing windows' runs, failed, as the user finds them: the commit
    failed twice, abort ran, nothing of them published."""
    runs = []
    for h in range(failing_window, failing_window + FAILING):
        run = live.client.wait_for_run(DAG_ID, live.run_of(h)["dag_run_id"], timeout=900)
        assert run["state"] == "failed", live.explain(run["dag_run_id"])
        tis = {ti["task_id"]: ti for ti in live.client.task_instances(DAG_ID, run["dag_run_id"])}
        assert (tis[f"{GROUP}.commit"]["state"], tis[f"{GROUP}.commit"]["try_number"]) == ("failed", 2)
        assert tis[f"{GROUP}.abort"]["state"] == "success"
        window = T0 + h * HOUR
        assert live.sql("SELECT state FROM eos.windows WHERE window_start = %s", window) == [("planned",)]
        assert live.sql("SELECT epoch, state FROM eos.attempts WHERE window_start = %s", window) == [(1, "aborted")]
        assert live.sql("SELECT count(*) FROM analytics.orders WHERE eos_window_start = %s", window) == [(0,)]
        runs.append(run)
    assert sorted(p.name for p in live.fault_state.iterdir()) == sorted(f"{FAULT}.{n}" for n in range(FAULT_TRIES))
    assert live.sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'") == [(0,)]
    live.audit()  # the failed windows published nothing; the others are intact
    return runs


def assert_rerun_committed_once(live: Live, run_id: str, h: int) -> None:
    """The cleared run of window h succeeded: its second attempt published it,
    and the auditor proves every committed window against Kafka, record by record."""
    rerun = live.client.wait_for_run(DAG_ID, run_id, timeout=900)
    assert rerun["state"] == "success", live.explain(run_id)
    summary = live.client.xcom(DAG_ID, run_id, f"{GROUP}.commit")
    assert (summary["outcome"], summary["epoch"], summary["committed_epoch"]) == ("published", 2, 2)
    window = T0 + h * HOUR
    assert live.sql("SELECT epoch, state FROM eos.attempts WHERE window_start = %s ORDER BY epoch", window) == \
        [(1, "aborted"), (2, "committed")]
    committed = [start for (start,) in live.sql(
        "SELECT window_start FROM eos.windows WHERE pipeline = %s AND state = 'committed' ORDER BY 1", DAG_ID)]
    assert window in committed
    report = live.audit()
    produced = sum(live.per_window[(start - T0) // HOUR] for start in committed)
    assert report.committed_windows == len(committed)
    assert report.totals.kafka_records == produced
    assert report.totals.published_rows + report.totals.dead_letters == produced
    assert live.sql("SELECT count(*) FROM analytics.orders WHERE eos_window_start = %s", window) == \
        live.sql("SELECT published_rows FROM eos.windows WHERE pipeline = %s AND window_start = %s", DAG_ID, window)
    for partition, rs in tiling(live).items():
        assert all(a[2] == b[1] for a, b in pairwise(rs)), (partition, rs)


def test_a_window_failing_mid_commit_fails_its_run_and_a_clear_reruns_it_exactly_once(live, failed_windows):
    run = failed_windows[0]
    h = BACKFILLED

    # the UI's Clear, as the REST API receives it, of the failed window's task group (the fault has fired)
    live.client.clear_task_group(DAG_ID, run["dag_run_id"], GROUP)
    assert_rerun_committed_once(live, run["dag_run_id"], h)
    assert live.audit().committed_windows == BACKFILLED + 1
    offsets = dict(live.sql('SELECT partition, "offset" FROM eos.partition_offsets WHERE pipeline = %s', DAG_ID))
    assert offsets == {p: (BACKFILLED + 1) * PER_HOUR // PARTITIONS for p in range(PARTITIONS)}


# --------------------------------------------------------------------------- the UI, in a browser

STATUS_PAGE = "/eos/"  # the package's plugin, served by the api-server
STATUS_NAV_ROUTE = "/plugin/eos-windows"  # the same page inside the Airflow UI (its nav's Browse menu)
HOSTILE = "<img src=x onerror=window.eosInjected=1>&amp;\"'"


def require_browser() -> None:
    reason = ui.missing()
    if reason:
        pytest.fail(reason)


def save_doc_image(shot: Path, name: str) -> None:
    """``EOS_SAVE_UI_PNG=1`` copies a screenshot to docs/img/ (the README's)."""
    if os.environ.get("EOS_SAVE_UI_PNG") or (name == "grid.png" and os.environ.get("EOS_SAVE_GRID_PNG")):
        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, ROOT / "docs" / "img" / name)


def get_status(url: str, token: str | None = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def expected_offsets(committed_windows: int) -> dict[int, tuple[int, int]]:
    """Per partition: (committed offset, lag) once the first ``committed_windows``
    windows are committed: each window holds PER_HOUR / PARTITIONS records of a
    partition, and its log ends one record (the closing one) after the last window."""
    per = PER_HOUR // PARTITIONS
    return {p: (committed_windows * per, HOURS * per + 1 - committed_windows * per) for p in range(PARTITIONS)}


def test_the_window_status_page_reads_the_ledger(live, failed_windows):
    """With the seventh window rerun and the eighth failed, the page's JSON is
    the ledger's state. (This stack makes every caller an admin,
    ``simple_auth_manager_all_admins``; test_ui.py shows the page refusing an
    unauthenticated request on the api-server's app with auth on.)"""
    base = live.stack.url.rstrip("/")
    assert get_status(base + "/eos/api/pipelines", token="not-a-jwt")[0] == 403  # a bad token is still refused
    code, body = get_status(base + "/eos/api/pipelines", token=live.client._fetch_token())
    assert code == 200, body
    answer = json.loads(body)
    [status] = [p for p in answer["pipelines"] if p["pipeline"] == DAG_ID]
    password = psycopg.conninfo.conninfo_to_dict(live.target_url).get("password")
    assert not password or password not in body
    assert status["dag_id"] == DAG_ID and status["counts"] == {"committed": BACKFILLED + 1, "failed": 1}
    windows = {datetime.fromisoformat(w["start"]): w for w in status["windows"]}
    assert sorted(windows) == [T0 + h * HOUR for h in range(BACKFILLED + FAILING)]
    ledger = {start: (rows, dead) for start, rows, dead in live.sql(
        "SELECT window_start, published_rows, dead_letter_rows FROM eos.windows WHERE pipeline = %s", DAG_ID)}
    for start, w in windows.items():
        assert (w["published_rows"], w["dead_letter_rows"]) == ledger[start]
    failed = windows[T0 + (BACKFILLED + 1) * HOUR]
    assert (failed["status"], failed["attempts"], failed["epoch"], failed["committed_epoch"]) == \
        ("failed", {"aborted": 1}, 1, None)
    rerun = windows[T0 + BACKFILLED * HOUR]
    assert (rerun["status"], rerun["attempts"], rerun["committed_epoch"]) == \
        ("committed", {"committed": 1, "aborted": 1}, 2)
    offsets = {p["partition"]: (p["committed_offset"], p["lag"]) for p in status["partitions"]}
    assert offsets == expected_offsets(BACKFILLED + 1)
    assert status["verify"].startswith("not recorded in the ledger")


def test_the_window_status_page_in_the_airflow_ui(live, failed_windows, tmp_path):
    """The page in the Airflow UI's frame, as a user opens it from the nav, in
    headless Chromium; then a pipeline named like an HTML injection is shown as text."""
    require_browser()
    with ui.browser() as driver:
        from selenium.webdriver.common.by import By

        ui.open_ui(driver, live.stack.url.rstrip("/") + STATUS_NAV_ROUTE)
        frame = ui.wait_for(driver, lambda d: d.find_elements(By.TAG_NAME, "iframe"), "the plugin's frame")[0]
        driver.switch_to.frame(frame)
        ui.wait_for(driver, lambda d: DAG_ID in ui.page_text(d), "the pipeline's section")
        section = driver.find_element(By.CSS_SELECTOR, f'section[aria-label="pipeline {DAG_ID}"]')
        assert f"{BACKFILLED + 1} committed, 1 failed" in section.text
        rows = section.find_elements(By.CSS_SELECTOR, f'table[aria-label="windows of {DAG_ID}"] tbody tr')
        cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]
        assert [c[2] for c in cells] == ["failed"] + ["committed"] * (BACKFILLED + 1)  # newest first
        assert cells[0][:6] == [f"{T0 + (BACKFILLED + 1) * HOUR:%Y-%m-%d %H:%M}",
                                f"{T0 + (BACKFILLED + 2) * HOUR:%Y-%m-%d %H:%M}", "failed", "1", "–", "1 aborted"]
        assert cells[1][2:6] == ["committed", "2", "2", "1 committed, 1 aborted"]
        offsets = section.find_elements(By.CSS_SELECTOR, f'table[aria-label="offsets of {DAG_ID}"] tbody tr')
        shown = {int(c[1]): (int(c[2]), int(c[4])) for c in
                 ([td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in offsets)}
        assert shown == expected_offsets(BACKFILLED + 1)
        driver.switch_to.default_content()
        shot = ui.save_screenshot(driver, tmp_path / "windows.png")
        width, height, colours = png_size_and_colours(shot)
        assert (width, height) == (1600, 1000) and colours > 20, (width, height, colours)
        save_doc_image(shot, "windows.png")

        # user input in a pipeline name is shown, never run
        ledger = Ledger(live.target_url)
        with ledger.connect() as conn, conn.transaction():
            ledger.lock_pipeline(conn, HOSTILE)
        try:
            ui.open_ui(driver, live.stack.url.rstrip("/") + STATUS_PAGE, ready_text=(HOSTILE,))
            assert driver.find_elements(By.CSS_SELECTOR, "img") == []
            assert driver.execute_script("return window.eosInjected") is None
        finally:
            live.sql("DELETE FROM eos.pipelines WHERE pipeline = %s RETURNING 1", HOSTILE)


def test_clear_in_the_airflow_ui_reruns_the_failed_window_exactly_once(live, failed_windows):
    """What the user does: open the failed window's run, open its task group,
    press Clear, confirm. Then the window commits once and verify is clean."""
    require_browser()
    h = BACKFILLED + 1
    run_id = failed_windows[1]["dag_run_id"]
    assert live.client.dag_run(DAG_ID, run_id)["state"] == "failed"
    base = live.stack.url.rstrip("/")
    with ui.browser() as driver:
        from selenium.webdriver.common.by import By

        run_page = f"{base}/dags/{DAG_ID}/runs/{run_id}"  # as the UI links it
        ui.open_ui(driver, run_page, ready_text=("Failed", f"{GROUP}.commit"))
        ui.open_ui(driver, f"{run_page}/tasks/group/{GROUP}", ready_text=(f"{GROUP}.await_checkpoint",))
        clear = ui.wait_for(driver, lambda d: [b for b in d.find_elements(
            By.CSS_SELECTOR, 'button[aria-label="Press shift+c to clear"]') if b.is_displayed()],
            "the task group's Clear button")
        clear[0].click()
        dialog = ui.wait_for(driver, lambda d: [x for x in d.find_elements(By.CSS_SELECTOR, "[role=dialog]")
                                                 if f"Clear Task Instances: {GROUP}" in x.text
                                                 and "Affected Tasks: 5" in x.text], "the Clear dialog")[0]
        for task in ("plan", "stage", "await_checkpoint", "commit", "abort"):
            assert f"{GROUP}.{task}" in dialog.text, dialog.text
        [confirm] = [b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text.strip() == "Confirm"]
        confirm.click()
        ui.wait_for(driver, lambda d: live.client.dag_run(DAG_ID, run_id)["state"] != "failed",
                    "the run leaving the failed state", timeout=60)
    assert_rerun_committed_once(live, run_id, h)
    assert live.audit().committed_windows == BACKFILLED + FAILING
    offsets = dict(live.sql('SELECT partition, "offset" FROM eos.partition_offsets WHERE pipeline = %s', DAG_ID))
    assert offsets == {p: o for p, (o, _) in expected_offsets(BACKFILLED + FAILING).items()}


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct colours in every 10th row) of an 8-bit RGB(A) PNG."""
    import numpy as np

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and not interlace, header
    bpp = 3 if colour_type == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, stride + 1)
    colours, prev = set(), np.zeros(stride, dtype=np.uint8)
    for y in range(height):  # undo the row filters
        kind, cur = raw[y, 0], raw[y, 1:]
        if kind == 0:
            row = cur.copy()
        elif kind == 1:
            row = (np.cumsum(cur.reshape(width, bpp), axis=0) % 256).astype(np.uint8).ravel()
        elif kind == 2:
            row = cur + prev
        else:
            row = np.zeros(stride, dtype=np.uint8)
            for x in range(stride):
                a = int(row[x - bpp]) if x >= bpp else 0
                b = int(prev[x])
                c = int(prev[x - bpp]) if x >= bpp else 0
                if kind == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                row[x] = (int(cur[x]) + pred) & 0xFF
        if y % 10 == 0:
            colours.update(map(bytes, row.reshape(width, bpp)[:, :3]))
        prev = row
    return width, height, len(colours)


def test_grid_view_renders_in_headless_chromium(live, backfilled, tmp_path):
    """The DAG's grid, with the window task group open, after the runs above.
    ``EOS_SAVE_UI_PNG=1`` (or ``EOS_SAVE_GRID_PNG=1``) also copies it to docs/img/grid.png (the README's)."""
    require_browser()
    for backfill in live.client.backfills(DAG_ID):  # no "backfill in progress" banner
        live.client.wait_for_backfill(backfill["id"], timeout=60)
    runs = len(live.client.dag_runs(DAG_ID))
    layout = json.dumps({"details-panel,main-panel": {"expandToSizes": {}, "layout": [36, 64]}})
    with ui.browser(width=1600, height=1000) as driver:
        ui.open_ui(driver, f"{live.stack.url.rstrip('/')}/dags/{DAG_ID}",
                   local_storage={f"{DAG_ID}/open-groups": json.dumps([GROUP]),  # the UI keeps these there
                                  "react-resizable-panels:grid-ltr": layout},
                   ready_text=("await_checkpoint", f"Last {runs} Dag Runs"))
        time.sleep(1.5)  # let the last fetched data paint
        shot = ui.save_screenshot(driver, tmp_path / "grid.png")
    assert shot.stat().st_size > 30_000, shot.stat().st_size
    width, height, colours = png_size_and_colours(shot)
    assert (width, height) == (1600, 1000)
    assert colours > 50, f"the page looks blank ({colours} colours)"
    save_doc_image(shot, "grid.png")
