"""The window status page without a live stack: what it reads from a real
ledger (PostgreSQL) and a real broker, how it renders it (escaped), and that
Airflow discovers the plugin from the installed package.

The page behind the api-server's auth, in headless Chromium, and the user's
Clear in the real UI run on the live stack in test_live_stack.py (one stack
for both: starting it costs minutes).
"""

from __future__ import annotations

import html.parser
import re

from airflow_eos.core import attempt as attempts
from airflow_eos.core.windows import TopicPartition
from airflow_eos.core.source import KafkaLog
from airflow_eos.ui import status as ui_status
from airflow_eos.ui.page import render

HOSTILE = "<script>window.x=1</script>&amp;\"'"


class TextAndTags(html.parser.HTMLParser):
    """Every start tag and the page's text, as a browser would parse them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def parsed(page: str) -> TextAndTags:
    parser = TextAndTags()
    parser.feed(page)
    return parser


def test_the_page_reads_every_windows_state_from_the_ledger(ledger, freeze_windows, topics):
    """Five windows, one of each state the page tells apart, each made by the
    ledger's own steps (open, abort, commit), and the lag against a real log."""
    topic = topics.create(partitions=2)
    topics.produce(topic, [(p, 1_700_000_000_000 + i, b"x") for p in (0, 1) for i in range(23)])
    plans = freeze_windows("orders", [0, 1, 2, 3, 4], partitions=((topic, 0), (topic, 1)), per_window=4)
    freeze_windows(HOSTILE, [0], partitions=((topic, 0),), per_window=4)
    with ledger.connect() as conn, conn.transaction():
        windows = [p.window for p in plans]
        for i in (0, 1):  # committed (window 0); replaced: committed twice (window 1)
            attempts.mark_committed(conn, attempts.open_attempt(conn, windows[i]), 7, 1)
        attempts.mark_committed(conn, attempts.open_attempt(conn, windows[1]), 6, 2)
        failed = attempts.open_attempt(conn, windows[2])  # failed: its only attempt aborted
        attempts.mark_aborted(conn, failed, "boom")
        attempts.mark_aborted(conn, attempts.open_attempt(conn, windows[3]), "boom")  # running: a second one is open
        attempts.open_attempt(conn, windows[3])
        # window 4: planned, never staged

    statuses = ui_status.read_ledger(ledger)
    assert [s.pipeline for s in statuses] == sorted(["orders", HOSTILE])
    [orders] = [s for s in statuses if s.pipeline == "orders"]
    by_start = {w.record.start: w for w in orders.windows}
    assert [by_start[w.start].status.value for w in windows] == ["committed", "replaced", "failed", "running",
                                                                 "planned"]
    assert [w.record.start for w in orders.windows] == sorted(by_start, reverse=True)  # newest first
    replaced = by_start[windows[1].start]
    assert (replaced.record.epoch, replaced.record.committed_epoch, replaced.record.published_rows,
            replaced.record.dead_letter_rows) == (2, 2, 6, 2)
    assert by_start[windows[3].start].attempts == {attempts.AttemptState.ABORTED: 1, attempts.AttemptState.OPEN: 1}
    # the contiguous committed prefix is windows 0 and 1: offset 8 of each partition
    assert {p.tp: p.committed_offset for p in orders.partitions} == {TopicPartition(topic, 0): 8,
                                                                       TopicPartition(topic, 1): 8}
    with KafkaLog({"bootstrap.servers": topics.bootstrap}) as kafka:
        ends = ui_status.read_log_ends(kafka, ui_status.topics_of(orders))
    assert ends == {TopicPartition(topic, 0): 23, TopicPartition(topic, 1): 23}
    with_lag = ui_status.with_lag(orders, ends)
    assert {p.tp.partition: p.lag for p in with_lag.partitions} == {0: 15, 1: 15}
    assert with_lag.to_dict()["counts"] == {"committed": 1, "replaced": 1, "failed": 1, "running": 1,
                                             "planned": 1}

    page = render([with_lag] + [s for s in statuses if s.pipeline == HOSTILE], source="the test's ledger")
    tree = parsed(page)
    assert "script" not in tree.tags and tree.tags.count("section") == 2
    text = "".join(tree.text)
    assert HOSTILE in text  # shown as the text it is
    assert "1 committed, 1 failed, 1 planned, 1 replaced, 1 running" in text
    assert "Last verify: not recorded in the ledger: run airflow-eos verify --pipeline orders" in text

    # what `airflow-eos verify` records (tests/integration/test_cli.py shows it writing this), shown as one line
    assert ledger.record_verify_run("orders", {
        "target": "analytics.orders", "clean": False, "committed_windows": 2, "kafka_records": 30,
        "published_rows": 27, "dead_letters": 2, "duplicates": 0, "missing": 1, "extra": 0, "violations": 1})
    [orders] = [s for s in ui_status.read_ledger(ledger) if s.pipeline == "orders"]
    assert re.fullmatch(r"1 violation\(s\) at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC against analytics\.orders: "
                        r"2 committed window\(s\), 30 Kafka records: 27 published, 2 dead letters, 0 duplicates, "
                        r"1 missing, 0 extra", orders.verify), orders.verify
    assert f"Last verify: {orders.verify}" in "".join(parsed(render([orders], source="x")).text)


def test_a_database_without_a_ledger_shows_no_pipeline(pg_url):
    from airflow_eos.core.ledger import Ledger

    assert ui_status.read_ledger(Ledger(pg_url)) == []
    assert "No pipeline in this ledger yet" in render([], source="x")


def test_airflow_discovers_the_plugin_from_the_installed_package(airflow_db):
    from airflow import plugins_manager

    apps, _ = plugins_manager.get_fastapi_plugins()
    [app] = [a for a in apps if a["url_prefix"] == "/eos"]
    assert app["name"] == "Exactly-once windows"
    external_views, _ = plugins_manager._get_ui_plugins()
    [view] = [v for v in external_views if v["url_route"] == "eos-windows"]
    assert (view["href"], view["destination"]) == ("/eos/", "nav")


def test_the_page_is_behind_airflow_auth(airflow_db, pg_url, monkeypatch):
    """Airflow's own api-server app (auth on: the simple auth manager, not
    all-admins) with the plugin mounted as the api-server mounts it: no token,
    401; a bad one or a user without DAG-run read access, 403; the UI's cookie
    or a bearer token of an admin, the page."""
    import json

    from fastapi.testclient import TestClient
    from psycopg.conninfo import conninfo_to_dict

    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    pg = conninfo_to_dict(pg_url)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    monkeypatch.setenv("AIRFLOW_CONN_POSTGRES_DEFAULT", json.dumps(
        {"conn_type": "postgres", "host": pg["host"], "port": int(pg["port"]), "login": pg["user"],
         "schema": pg["dbname"], "password": pg.get("password")}))
    monkeypatch.setenv("AIRFLOW__EOS__UI_KAFKA_CONN_ID", "")
    client = TestClient(create_app(apps="core"))
    auth = get_auth_manager()
    admin = auth.generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    nobody = auth.generate_jwt(SimpleAuthManagerUser(username="nobody", role=None))
    for path in ("/eos/", "/eos/api/pipelines"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403, path
        assert client.get(path, headers={"Authorization": f"Bearer {nobody}"}).status_code == 403, path
    answer = client.get("/eos/api/pipelines", headers={"Authorization": f"Bearer {admin}"})
    assert answer.status_code == 200 and answer.json()["pipelines"] == [], answer.text
    page = client.get("/eos/", cookies={"_token": admin})  # as the browser sends it
    assert page.status_code == 200 and "No pipeline in this ledger yet" in page.text
    if pg.get("password"):
        assert pg["password"] not in answer.text
