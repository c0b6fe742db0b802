"""A window's stage on a real Spark standalone cluster: a master and a worker
started from the installed PySpark (``spark-class``), on 127.0.0.1, stopped by
the test. The example DAG runs through real Airflow (dag.test) with
``spark_default`` a ``spark`` connection whose host is the master's URL, so the
stage operator runs ``spark-submit --master spark://127.0.0.1:PORT`` (client
deploy mode) as on a user's cluster. The package reaches the executors the way
the README says: installed in the interpreter the driver names for them
(``PYSPARK_PYTHON``). Exactly-once is shown by lineage; that the Kafka reader
and the staging writer ran in the worker's executor, not in the driver, by the
executor's own log in the worker's directory and the master's record of the
application."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from airflow_eos.embedded import free_port
from airflow_eos.embedded.processes import stop_process, wait_for_port

from harness.dags import run_window, states
from test_orders_dag import T0, audit, fresh_topic, load_dag, produce_orders, run_after, sql, window_date  # noqa: F401

pytestmark = pytest.mark.slow

import pyspark  # noqa: E402

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"


def process_group_alive(pgid: int, wait: float = 10.0) -> bool:
    """Is any process of the group still there after ``wait`` seconds (killed
    members may take a moment to be reaped)?"""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


def master_state(webui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=10) as response:
        return json.load(response)


def master_workers(webui_port: int) -> list[dict]:
    """The workers the master knows; none while its web UI is still starting:
    its port opens before its JSON view is attached, and in between it answers
    with an HTML page or with 404 (CI saw the 404 on a loaded machine)."""
    try:
        return master_state(webui_port).get("workers", [])
    except (ValueError, urllib.error.HTTPError):
        return []


@pytest.fixture
def standalone_cluster():
    """A master and a one-core worker, each the leader of its own process group
    (the worker's executors are its children, in its group); both groups are
    killed and checked gone at the end. Yields (master URL, master web UI port,
    the worker's work directory)."""
    logs = Path(tempfile.mkdtemp(prefix="eos-spark-cluster-"))
    work_dir = logs / "worker"
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable,
           # No REST submission server: it would listen on a fixed port (6066).
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        with open(logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen([str(SPARK_CLASS), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        procs.append(proc)
        return proc

    url = f"spark://127.0.0.1:{port}"
    try:
        master = start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                       "--port", str(port), "--webui-port", str(master_ui))
        wait_for_port(port, 120, master)
        wait_for_port(master_ui, 60, master)
        worker = start("worker", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                       "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui),
                       "--work-dir", str(work_dir))
        deadline = time.monotonic() + 120
        while not [w for w in master_workers(master_ui) if w.get("state") == "ALIVE"]:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited: {(logs / 'worker.log').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no worker registered with {url}: {(logs / 'worker.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield url, master_ui, work_dir
    finally:
        for proc in reversed(procs):
            stop_process(proc, grace=10.0, group=True)
        leftover = [proc.pid for proc in procs if process_group_alive(proc.pid)]
        if not leftover:
            shutil.rmtree(logs, ignore_errors=True)
    assert not leftover, f"process groups still alive after stop: {leftover} (logs in {logs})"


def test_a_window_staged_on_a_standalone_cluster_publishes_every_record_once(
        airflow_connections, kafka_config, topics, monkeypatch, run_after, standalone_cluster):  # noqa: F811
    url, master_ui, work_dir = standalone_cluster
    pg_url = airflow_connections
    # spark_default is the cluster, as a user's is: spark-submit of the stage job in client
    # deploy mode (the driver in the Airflow task's spark-submit, the tasks on the worker).
    host, _, port = url.rpartition(":")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": host, "port": int(port),
         "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"}}))
    # What the README tells a cluster's users: spark-submit on PATH, and PYSPARK_PYTHON naming an
    # interpreter with airflow-eos installed on every worker (here the same machine's venv).
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)

    fresh_topic(topics, "orders")
    counts = produce_orders(topics, hours=1, per_hour=2_000)
    run = run_window(load_dag("orders_hourly"), window_date(0), run_after(0))
    assert run.state == "success", states(run)

    report = audit(pg_url, kafka_config)
    (w,) = report.windows
    assert (w.published_rows, w.dead_letters) == (counts["good"][0], counts["bad"][0])
    assert (w.duplicates, w.missing, w.extra) == (0, 0, 0)
    assert sql(pg_url, 'SELECT count(*), count(DISTINCT (eos_topic, eos_partition, eos_offset))'
                       ' FROM analytics.orders') == [(counts["good"][0], counts["good"][0])]
    assert sql(pg_url, "SELECT epoch, state FROM eos.attempts") == [(1, "committed")]
    assert dict(sql(pg_url, 'SELECT partition, "offset" FROM eos.partition_offsets')) == {p: 500 for p in range(4)}

    # The master ran the stage job as an application on the worker's core.
    apps = master_state(master_ui)["completedapps"]
    assert [a["name"] for a in apps] == ["airflow-eos-stage"], apps
    assert apps[0]["cores"] == 1, apps
    # Its executor ran in a JVM of the worker, outside the driver: the worker's directory
    # for the application has the executor's own log, which names its process and shows
    # it running the tasks that read Kafka and wrote the staging.
    (app_dir,) = [d for d in work_dir.iterdir() if d.name == apps[0]["id"]]
    executor_logs = list(app_dir.glob("*/stderr"))
    assert executor_logs, list(app_dir.rglob("*"))
    text = "\n".join(log.read_text(errors="replace") for log in executor_logs)
    started = re.search(r"Started daemon with process name: (\d+)@", text)
    assert started and int(started.group(1)) != os.getpid(), text[-3000:]
    assert "CoarseGrainedExecutorBackend" in text, text[-3000:]
    finished = re.findall(r"Executor: Finished task \S+ in stage", text)
    assert len(finished) >= 4, text[-3000:]  # one task per Kafka partition at least, all on this executor
    assert re.search(r"DataWritingSparkTask: Committed partition", text), text[-3000:]
    # The package's own code ran there: the Kafka reader read every planned range, and the
    # staging writer staged every row and dead letter of the window (its chunks' log lines).
    read = set(re.findall(r"airflow_eos\.spark\.kafka_source: orders\[(\d)\] \[0, 500\) piece \d+/\d+: reading", text))
    assert read == {"0", "1", "2", "3"}, text[-3000:]
    # "N rows, D dead letters", or "N rows (binary COPY), D dead letters" where the writer names its format
    chunks = re.findall(r"airflow_eos\.staging\.writer: staged chunk \d+ into \S+: "
                        r"(\d+) rows(?: \([^)]*\))?, (\d+) dead", text)
    assert (sum(int(r) for r, _ in chunks), sum(int(d) for _, d in chunks)) == (counts["good"][0], counts["bad"][0])
