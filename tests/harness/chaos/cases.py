"""What the fault suite's test modules share besides fixtures: the suite's
source shape, a pipeline with a target of its own, a scratch ledger database,
and running a module's selected cases side by side (the cases wait on the
broker and the database far more than they compute).

Test modules import these from here, not from their conftest: under
pytest-xdist ``import conftest`` names whichever conftest module was imported
last, not the one beside the test.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from airflow_eos.core.ledger import Ledger
from airflow_eos.targets.files.storage import files_for
from harness import chaos
from harness.databases import empty_database

HOURS = 6  # windows available in the shared topic
PER_HOUR = 12  # records per partition and hour
PARTITIONS = 2
# Scenarios wait on the broker and the database far more than they compute:
# run this many at once (each test item still reports its own scenario).
PARALLEL = int(os.environ.get("EOS_CHAOS_PARALLEL") or 4)


def new_pipeline(url: str, source: dict, name: str, *, on_committed: str = "skip", mirror: bool = False,
                 mode: str = "replace_window", target: str = "postgres", root: Path | str | None = None,
                 **kwargs) -> chaos.Pipeline:
    """A Pipeline with a target of its own, its ledger in the database at
    ``url``: ``target="postgres"``, a table there (for ``mode``);
    ``target="files"``, a new directory under ``root`` (the test's tmp dir, or
    an hdfs:// URL);
    ``target="kafka"``, a new topic on the source's cluster; ``target="iceberg"``,
    a new table in the ledger's SQL catalog, located under ``root``."""
    name = chaos.slug(name)[:40] + "_" + uuid.uuid4().hex[:6]
    table = ""
    target_topic = None
    if target == "kafka":
        target_topic = f"chaos-out-{name}"
        chaos.create_topic(source["kafka_config"]["bootstrap.servers"], target_topic, PARTITIONS)
    elif target == "iceberg":
        from harness.chaos.source import _OUT_SCHEMA
        from harness.iceberg import create_table
        if root is None:
            raise ValueError("an Iceberg target's pipeline needs root=<a directory under the test's tmp dir>")
        table = f"chaos.{name}"
        create_table(url, table, root / "warehouse", _OUT_SCHEMA)
    elif target == "files":
        if root is None:
            raise ValueError("a file target's pipeline needs root=<a directory under the test's tmp dir>")
        root = f"{root}/{name}"
        files_for(root).makedirs(root)
    else:
        table = f"chaos.{name}"
        chaos.create_target_table(url, table, mode)
    return chaos.Pipeline(
        name=name, url=url, table=table, kafka_config=source["kafka_config"], topics=(source["topic"],),
        on_committed=on_committed, mode=mode, mirror_group=f"eos-mirror-{name}" if mirror else None,
        target_kind=target, root=str(root) if target == "files" else None, target_topic=target_topic,
        avro=source.get("avro"), **kwargs)


@contextlib.contextmanager
def scratch_database(server_url: str, *, template: str | None = None, durable: bool = False):
    """A fresh ledger database (for scenarios that sweep: the sweep is
    database-wide): a copy of ``template`` (ledger_template), or migrated here.
    ``durable``: every commit in it waits for its WAL to be on disk (the test
    servers run with synchronous_commit=off, whose acknowledged commits a
    crash loses), set before any connection opens: a session keeps the setting
    it started with, and the ledger's pool reuses the migration's sessions."""
    settings = {"synchronous_commit": "on"} if durable else None
    with empty_database(server_url, template=template, settings=settings) as url:
        if template is None:
            Ledger(url).migrate()
        yield url


def selected_params(request, function: str) -> list[dict]:
    """The parameters of the selected (after -k, deselection) items of a test
    function, for module fixtures that run every selected case at once."""
    return [item.callspec.params for item in request.session.items
            if getattr(item, "originalname", None) == function and item.module is request.module]


def run_concurrently(cases: dict, fn, parallel: int) -> dict:
    """{key: fn(*args)} for cases {key: args}, ``parallel`` at a time; a
    failure is kept as its exception, to be raised by the case's own test."""
    results: dict = {}

    def one(key):
        try:
            results[key] = fn(*cases[key])
        except BaseException as exc:  # noqa: BLE001 - reported by the case's test
            results[key] = exc

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        list(pool.map(one, cases))
    return results


class Rolling:
    """Cases run in the background, ``parallel`` at once, started in the order
    the tests will ask for them (``keys``, as selected_params lists them) and
    at most ``ahead`` cases ahead of the test that asks: each case's test
    waits for its own case only, so any number of cases runs to the end (no
    fixture holds them all), and a worker that finishes a case starts the next
    one at once (no batch waits for its slowest case)."""

    def __init__(self, keys: list, fn, *, parallel: int, ahead: int):
        self.keys, self.fn, self.ahead = list(keys), fn, max(1, ahead)
        self.position = {key: n for n, key in enumerate(self.keys)}
        self.pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="chaos-case")
        self.futures: dict = {}
        self.started = 0

    def _run(self, key):
        try:
            return self.fn(*key)
        except BaseException as exc:  # noqa: BLE001 - reported by the case's test
            return exc

    def result(self, key):
        """The case's result (its exception, if it failed); starts the cases up to ``ahead`` past it."""
        last = min(len(self.keys), self.position[key] + 1 + self.ahead)
        while self.started < last:
            k = self.keys[self.started]
            self.futures[k] = self.pool.submit(self._run, k)
            self.started += 1
        return self.futures.pop(key).result()

    def close(self) -> None:
        """Cancel the cases not started (a run stopped early: -x, Ctrl-C); wait for the running ones."""
        self.pool.shutdown(wait=True, cancel_futures=True)
