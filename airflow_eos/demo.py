"""``make demo`` / ``airflow-eos demo``: the main job, end to end, on embedded services.

1. start a throwaway PostgreSQL and the embedded Kafka-protocol broker (127.0.0.1)
2. produce four hours of order events, with malformed and late records
3. run the example DAG ``orders_hourly`` for each hourly window through real
   Airflow (``dag.test``) and real Spark (``spark-submit``, local[2])
4. crash a Spark worker in the middle of staging one window, on both tries:
   the run fails, abort cleans up; then Clear the run, as the UI does, and it
   commits exactly once
5. rerun a committed window (Clear again): ``on_committed="skip"``, no change
6. audit everything against Kafka (``airflow-eos verify``, then ``status``: the
   CLI in a subprocess, as a user would run it) and print the tables

Each DAG run is a subprocess whose Airflow log goes to a file; this process
prints one line per step. Every process started here is stopped here.

The DAG is the package's own (``airflow_eos/examples/dags/orders_hourly.py``,
which the repository's ``dags/orders_hourly.py`` imports), so an installed wheel
runs the demo as the repository does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

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

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic("orders", 4, 1)]).values():
        f.result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
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


# --------------------------------------------------------------------------- Airflow


def airflow_environment(home: Path, pg_port: int, bootstrap: str) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}}),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": json.dumps({"conn_type": "postgres", "host": "127.0.0.1", "port": pg_port,
                                                     "login": "postgres", "schema": "postgres"}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def run_window(env: dict, log_file: Path, h: int, *, faults: str | None = None) -> str:
    """Run (or, again, Clear and rerun) the DAG run of window h in a subprocess;
    returns the run's state. A fixed run_after per window makes the second run of
    a window the same DAG run, cleared, as the UI's Clear does."""
    env = dict(env)
    env.pop("EOS_FAULTS", None)
    if faults:
        env["EOS_FAULTS"] = faults
    logical = T0 + (h + 1) * HOUR
    run_after = T0 + timedelta(days=1, minutes=h)
    with open(log_file, "a") as log:
        log.write(f"\n===== window {h} ({faults or 'no faults'}) =====\n")
        log.flush()
        proc = subprocess.run([sys.executable, "-m", "airflow_eos.demo", "--run-window", logical.isoformat(),
                               run_after.isoformat()], env=env, stdout=log, stderr=subprocess.STDOUT)
    states = {0: "success", 3: "failed"}
    return states.get(proc.returncode, f"error (exit {proc.returncode}, see {log_file})")


def _run_window_here(logical: str, run_after: str) -> int:
    """In the subprocess: one dag.test of orders_hourly; exit 0 success, 3 failed."""
    import runpy

    from airflow.utils import db

    db.initdb()
    dag = runpy.run_path(str(DAG_FILE))["dag"]
    run = dag.test(logical_date=datetime.fromisoformat(logical), run_after=datetime.fromisoformat(run_after))
    return 0 if run.state == "success" else 3


# --------------------------------------------------------------------------- the demo


def main() -> int:
    from airflow_eos.embedded import EmbeddedBroker, PostgresServer

    work = Path(tempfile.mkdtemp(prefix="eos-demo-"))
    log_file = work / "airflow.log"
    say("airflow-eos demo: exactly-once hourly windows, Kafka -> Spark -> PostgreSQL, through Airflow")
    say(f"  (Airflow and Spark logs: {log_file})")
    say()
    with PostgresServer() as pg, EmbeddedBroker() as broker:
        say(f"services: PostgreSQL on 127.0.0.1:{pg.port}, Kafka-protocol broker on {broker.bootstrap}")
        t = step("producing four hours of orders into topic 'orders' (4 partitions)")
        counts = produce_orders(broker.bootstrap)
        done(t, f"{counts['records']} records, {counts['malformed']} malformed, {counts['late']} late")
        env = airflow_environment(work / "airflow-home", pg.port, broker.bootstrap)
        say()
        say("running DAG orders_hourly, one run per hourly window:")
        for h in range(HOURS):
            window = f"[{(T0 + h * HOUR):%H:%M}, {(T0 + (h + 1) * HOUR):%H:%M})"
            if h == CRASHED_WINDOW:
                t = step(f"window {window}: Spark workers crash mid-COPY, on both tries of the stage")
                state = run_window(env, log_file, h, faults="stage.mid_write=crash")
                done(t, f"run {state}; abort dropped the failed attempts' staging")
                t = step(f"window {window}: Clear (the UI's rerun)")
                state = run_window(env, log_file, h)
                done(t, f"run {state}")
            else:
                t = step(f"window {window}")
                done(t, f"run {run_window(env, log_file, h)}")
        t = step("window [00:00, 01:00) again: Clear a committed window (on_committed='skip')")
        done(t, f"run {run_window(env, log_file, 0)}; committed already: no attempt, no Spark job, nothing republished")

        say()
        # The CLI as a user runs it, in a subprocess: the demo does not import the CLI,
        # whose `demo` subcommand imports this module.
        cli = [sys.executable, "-m", "airflow_eos.cli"]
        connections = ["--postgres-url", pg.url, "--kafka-bootstrap", broker.bootstrap]
        t = step("auditing the target against Kafka (airflow-eos verify)")
        audit = subprocess.run([*cli, "verify", "--pipeline", "orders_hourly", "--table", "analytics.orders",
                                *connections], capture_output=True, text=True)
        done(t)
        say()
        say(audit.stdout + audit.stderr)
        subprocess.run([*cli, "status", "--pipeline", "orders_hourly", *connections])
        say()
        say("where to look next:")
        say("  README.md                     the DAG API, reruns and backfills, running on a cluster")
        say("  docs/guarantees.md            what is guaranteed, under which assumptions, how it is tested")
        say(f"  {DAG_FILE}")
        say("                                the DAG this demo ran (dags/orders_hourly.py in the repository)")
        say("  airflow-eos status|verify     the same views on your own pipelines")
        say(f"  {log_file}  the Airflow and Spark logs of every run")
        return 0 if audit.returncode == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--run-window":
        sys.exit(_run_window_here(sys.argv[2], sys.argv[3]))
    sys.exit(main())
