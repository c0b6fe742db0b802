"""``make demo`` / ``airflow-eos demo``: the main job, end to end, on embedded services.

1. start a throwaway PostgreSQL, an Apache Kafka broker and a local
   Spark Connect server (``local[2]``), all on 127.0.0.1
2. produce four hours of order events, with malformed and late records
3. run the example DAG ``orders_hourly`` for each hourly window through real
   Airflow (``dag.test``) and real Spark: ``spark_default`` is a ``spark_connect``
   connection, so every window stages on the one warm server instead of paying
   a ``spark-submit`` and a JVM start
4. crash Spark's Python workers (exit 137, as a SIGKILL or an OOM kill) in the
   middle of staging one window, on both tries: the run fails, abort cleans up;
   then Clear the run, as the UI does, and it commits exactly once
5. rerun a committed window (Clear again): ``on_committed="skip"``, no change
6. audit everything against Kafka (``airflow-eos verify``, then ``status``: the
   CLI in a subprocess, as a user would run it) and print the tables

The DAG runs happen in one Airflow subprocess (imported once, started while the
Spark server starts) whose log goes to a file; this process prints one line per
step with its elapsed time. Every process started here is stopped here.

The DAG is the package's own (``airflow_eos/examples/dags/orders_hourly.py``,
which the repository's ``dags/orders_hourly.py`` imports), so an installed wheel
runs the demo as the repository does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow_eos.core.faults import ENV as FAULTS_ENV, STATE_ENV as FAULTS_STATE_ENV
from airflow_eos.core.windows import to_millis

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HOURS = 4
ORDERS_PER_HOUR = 2_500
HOUR = timedelta(hours=1)
CRASHED_WINDOW = 2
# Inside the package (package data), so the demo finds it in a wheel's install too.
DAG_FOLDER = Path(__file__).resolve().parent / "examples" / "dags"
DAG_FILE = DAG_FOLDER / "orders_hourly.py"


def say(text: str = "") -> None:
    print(text, flush=True)


def step(text: str) -> float:
    print(f"  … {text}", end="", flush=True)
    return time.monotonic()


def done(started: float, result: str = "ok") -> None:
    print(f"  {result} ({time.monotonic() - started:.1f}s)", flush=True)


# --------------------------------------------------------------------------- data


def produce_orders(bootstrap: str) -> dict[str, int]:
    """Orders over HOURS hours on 4 partitions; 1 % malformed; 40 late records
    (event time in hour 0, arriving after the last hour); one record per
    partition after the last hour so every window closes."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from airflow_eos.core.kafka_client import client_logging

    # Logging like the package's own clients: no raw librdkafka lines in the demo's output.
    admin = AdminClient({**client_logging(), "bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic("orders", 4, 1)]).values():
        f.result(15)
    producer = Producer({**client_logging(), "bootstrap.servers": bootstrap, "linger.ms": 20,
                         "enable.idempotence": True})
    counts = {"records": 0, "malformed": 0, "late": 0}

    def send(partition: int, ts: datetime, value: bytes) -> None:
        producer.produce("orders", value=value, partition=partition, timestamp=to_millis(ts))
        counts["records"] += 1

    n = 0
    for h in range(HOURS):
        for i in range(ORDERS_PER_HOUR):
            ts = T0 + h * HOUR + i * HOUR / ORDERS_PER_HOUR
            if n % 100 == 42:
                send(n % 4, ts, b'{"order_id": "o-%d", "amount": "twelve"' % n)  # truncated JSON
                counts["malformed"] += 1
            else:
                send(n % 4, ts, json.dumps({"order_id": f"o-{n}", "customer": f"c-{n % 97}",
                                            "amount": round(5 + (n * 7919 % 20000) / 100, 2)}).encode())
            n += 1
    for i in range(40):  # late: produced after hour 3, stamped in hour 0
        send(i % 4, T0 + timedelta(minutes=i), json.dumps({"order_id": f"late-{i}", "amount": 1.0}).encode())
        counts["late"] += 1
    for p in range(4):
        send(p, T0 + HOURS * HOUR + timedelta(seconds=1), json.dumps({"order_id": f"next-{p}", "amount": 1}).encode())
    producer.flush(60)
    return counts


# --------------------------------------------------------------------------- the crash


class WorkerCrash:
    """``stage.mid_write=crash`` in the Spark Connect server's Python workers (they
    inherit the server's environment), switched on for one window only.

    core.faults counts the firings of ``point=crash*N`` by creating ``point.0`` …
    ``point.N-1`` in ``EOS_FAULTS_STATE``: with every file in place nothing fires
    (disarmed); removing them lets the next N writes crash. Armed, a stage job
    fails however many of its tasks hit the point, on each try."""

    POINT = "stage.mid_write"
    FIRINGS = 100

    def __init__(self, state: Path) -> None:
        self.state = state
        self.disarm()

    @property
    def server_env(self) -> dict[str, str]:
        return {FAULTS_ENV: f"{self.POINT}=crash*{self.FIRINGS}", FAULTS_STATE_ENV: str(self.state)}

    def _claims(self) -> list[Path]:
        return list(self.state.glob(f"{self.POINT}.*"))

    def arm(self) -> None:
        for claim in self._claims():
            claim.unlink()

    def disarm(self) -> int:
        """Stop crashing; returns how many workers crashed since arm()."""
        crashed = len(self._claims())
        self.state.mkdir(parents=True, exist_ok=True)
        for n in range(self.FIRINGS):
            (self.state / f"{self.POINT}.{n}").touch()
        return crashed


# --------------------------------------------------------------------------- Airflow


def airflow_environment(home: Path, pg_url: str, bootstrap: str, spark_connect_port: int) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    pg = conninfo_to_dict(pg_url)
    return {
        **{k: v for k, v in os.environ.items() if k not in (FAULTS_ENV, FAULTS_STATE_ENV)},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}}),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": json.dumps({
            "conn_type": "postgres", "host": pg.get("host", "127.0.0.1"), "port": int(pg.get("port", 5432)),
            "login": pg.get("user", "postgres"), "password": pg.get("password"), "schema": pg.get("dbname")}),
        # The stage runs on the demo's warm Spark Connect server: no spark-submit, no JVM per window.
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                  "port": spark_connect_port}),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


class WindowRunner:
    """One Airflow process for all the demo's DAG runs: it imports Airflow, makes
    its database and parses the DAG once, then runs (or, again, Clears and
    reruns) the DAG run of a window per request. A fixed run_after per window
    makes the second run of a window the same DAG run, cleared, as the UI's
    Clear does. Its output (Airflow's and the Spark client's logs) goes to
    ``log_file``; the states come back on a pipe of their own."""

    def __init__(self, env: dict[str, str], log_file: Path) -> None:
        self.log_file = log_file
        read_fd, self._write_fd = os.pipe()
        results_fd, child_results_fd = os.pipe()
        with open(log_file, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "airflow_eos.demo", "--run-windows", str(read_fd), str(child_results_fd)],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(read_fd, child_results_fd))
        os.close(read_fd)
        os.close(child_results_fd)
        self._requests = os.fdopen(self._write_fd, "w", buffering=1)
        self._results = os.fdopen(results_fd, "r")

    def run(self, h: int, title: str) -> str:
        logical = T0 + (h + 1) * HOUR
        run_after = T0 + timedelta(days=1, minutes=h)
        try:
            self._requests.write(f"{logical.isoformat()} {run_after.isoformat()} {title}\n")
            self._requests.flush()
            answer = self._results.readline().strip()
        except BrokenPipeError:
            answer = ""
        return answer or f"error (the Airflow process exited with {self.proc.poll()}, see {self.log_file})"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._requests.close()  # end of requests: the process exits
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._results.close()

    def __enter__(self) -> "WindowRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _run_windows_here(requests_fd: int, results_fd: int) -> int:
    """In the Airflow process: a dag.test of orders_hourly per request line
    ("logical run_after title"); answers the run's state, one line each."""
    import runpy

    from airflow.utils import db

    db.initdb()
    dag = runpy.run_path(str(DAG_FILE))["dag"]
    # What the first window would otherwise pay (dag.test's in-process Execution API app, the SQL
    # operator's Postgres hook, the stage's Spark Connect client: pyspark's connect modules, grpc,
    # pandas), done now, while the server's JVM starts. Only a warm-up: skipped if Airflow moved it.
    import airflow.providers.postgres.hooks.postgres  # noqa: F401
    import pyspark.sql.connect.session  # noqa: F401

    import airflow_eos.spark.stage  # noqa: F401
    import httpx  # an Airflow dependency

    try:
        from airflow.sdk.execution_time.supervisor import in_process_api_server

        api = in_process_api_server()  # cached: dag.test's tasks use this one
        # Its first request builds the versioned routes (~70 s of a busy 2-core machine, measured
        # by the first task); any path does, whatever the answer.
        httpx.Client(transport=api.transport, base_url="http://in-process.invalid./").get("/execution/health")
    except (ImportError, AttributeError, httpx.HTTPError):
        pass
    with os.fdopen(requests_fd) as requests, os.fdopen(results_fd, "w", buffering=1) as results:
        for line in requests:
            logical, run_after, title = line.rstrip("\n").split(" ", 2)
            print(f"\n===== {title} =====", flush=True)
            run = dag.test(logical_date=datetime.fromisoformat(logical),
                           run_after=datetime.fromisoformat(run_after))
            results.write(f"{run.state}\n")
    return 0


def attempts_of(pg_url: str, h: int) -> str:
    """The window's attempts as the ledger has them, and staging left behind."""
    import psycopg

    with psycopg.connect(pg_url) as conn:
        states = conn.execute("SELECT state, count(*) FROM eos.attempts WHERE pipeline = 'orders_hourly'"
                              " AND window_start = %s GROUP BY state ORDER BY state", (T0 + h * HOUR,)).fetchall()
        staging = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'").fetchone()[0]
    return ", ".join(f"{n} {state}" for state, n in states) + f"; staging tables left: {staging}"


# --------------------------------------------------------------------------- the demo


def run_demo(pg_url: str, bootstrap: str, work: Path) -> int:
    """The story on the given PostgreSQL (target and ledger) and broker (its
    ``orders`` topic must not exist): windows, crash, Clear, rerun, audit.
    Returns 0 when the audit is clean."""
    from airflow_eos.embedded import SparkConnectServer

    began = time.monotonic()
    log_file = work / "airflow.log"
    crash = WorkerCrash(work / "faults")
    t = step("starting Spark Connect (local[2]) and Airflow")
    connect = SparkConnectServer("local[2]", env=crash.server_env)
    # The Airflow process imports Airflow and parses the DAG while the JVM starts.
    with WindowRunner(airflow_environment(work / "airflow-home", pg_url, bootstrap, connect.port), log_file) as runs, \
            connect:
        done(t, f"Spark Connect on {connect.url}")
        t = step("producing four hours of orders into topic 'orders' (4 partitions)")
        counts = produce_orders(bootstrap)
        done(t, f"{counts['records']} records, {counts['malformed']} malformed, {counts['late']} late")
        say()
        say("running DAG orders_hourly, one run per hourly window (stage on Spark Connect):")
        for h in range(HOURS):
            window = f"[{(T0 + h * HOUR):%H:%M}, {(T0 + (h + 1) * HOUR):%H:%M})"
            if h == CRASHED_WINDOW:
                t = step(f"window {window}: Spark's Python workers crash mid-COPY, on both tries of the stage")
                crash.arm()
                state = runs.run(h, f"window {h}, workers crashing")
                crashed = crash.disarm()
                done(t, f"run {state}; {crashed} workers crashed; attempts: {attempts_of(pg_url, h)}")
                t = step(f"window {window}: Clear (the UI's rerun)")
                done(t, f"run {runs.run(h, f'window {h}, cleared')}")
            else:
                t = step(f"window {window}")
                done(t, f"run {runs.run(h, f'window {h}')}")
        t = step("window [00:00, 01:00) again: Clear a committed window (on_committed='skip')")
        done(t, f"run {runs.run(0, 'window 0, cleared')}; committed already: no attempt, no Spark job, "
                "nothing republished")
        shutil.copy(connect.logfile.name, work / "spark-connect.log")

    say()
    # The CLI as a user runs it, in a subprocess: the demo does not import the CLI,
    # whose `demo` subcommand imports this module.
    cli = [sys.executable, "-m", "airflow_eos.cli"]
    connections = ["--postgres-url", pg_url, "--kafka-bootstrap", bootstrap]
    t = step("auditing the target against Kafka (airflow-eos verify)")
    audit = subprocess.run([*cli, "verify", "--pipeline", "orders_hourly", "--table", "analytics.orders",
                            *connections], capture_output=True, text=True)
    done(t)
    say()
    say(audit.stdout + audit.stderr)
    subprocess.run([*cli, "status", "--pipeline", "orders_hourly", *connections])
    say()
    say(f"demo: {time.monotonic() - began:.0f}s from the services' start to the audit")
    return 0 if audit.returncode == 0 else 1


def main() -> int:
    from airflow_eos.embedded import KafkaBroker, PostgresServer

    work = Path(tempfile.mkdtemp(prefix="eos-demo-"))
    say("airflow-eos demo: exactly-once hourly windows, Kafka -> Spark -> PostgreSQL, through Airflow")
    say(f"  (logs: Airflow {work / 'airflow.log'}, Spark {work / 'spark-connect.log'})")
    say()
    with PostgresServer() as pg, KafkaBroker() as broker:
        say(f"services: PostgreSQL on 127.0.0.1:{pg.port}, Apache Kafka on {broker.bootstrap}")
        code = run_demo(pg.url, broker.bootstrap, work)
    say()
    say("where to look next:")
    say("  README.md                     the DAG API, reruns and backfills, running on a cluster")
    say("  docs/guarantees.md            what is guaranteed, under which assumptions, how it is tested")
    say(f"  {DAG_FILE}")
    say("                                the DAG this demo ran (dags/orders_hourly.py in the repository)")
    say("  airflow-eos status|verify     the same views on your own pipelines")
    say(f"  {work}  the Airflow and Spark logs of every run")
    return code


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--run-windows":
        sys.exit(_run_windows_here(int(sys.argv[2]), int(sys.argv[3])))
    sys.exit(main())
