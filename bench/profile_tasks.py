"""The Airflow process's share of the exactly-once overhead (issue 37): the
bench's headline pair compares the window run by ``dag.test`` (four tasks:
plan, stage, await_checkpoint, commit) with the at-least-once baseline as a
plain Spark Connect client (no Airflow). Here, on the bench's services and
DAGs: the window's dag.test, the baseline as one Airflow task (dag.test) and
as a plain client, each in CPU seconds of this process (time.process_time),
the window's under cProfile too; and the Spark Connect server's own CPU while
it idles (what it burns during the window's non-Spark tasks).

    .venv/bin/python bench/profile_tasks.py --size 10000 --repeats 3
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from windows import airflow_env


def _prepare(bootstrap: str, pg_url: str, size: int) -> dict[int, int]:
    """Airflow's Kafka connection, the tables, the topic with ``size`` records: each partition's end."""
    import json

    import psycopg
    from confluent_kafka.admin import AdminClient, NewTopic
    from records import PARTITIONS, TOPIC, produce

    from airflow_eos.examples.transforms import ORDERS_TABLE_DDL, PARTITIONED_ORDERS_TABLE_DDL

    os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap, "fetch.wait.max.ms": 10}})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(ORDERS_TABLE_DDL)
        conn.execute(PARTITIONED_ORDERS_TABLE_DDL)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        f.result(15)
    return produce(bootstrap, TOPIC, size, PARTITIONS)


def _report(out: dict, profiled: float, idle: float, profile) -> None:
    """Medians of this process's CPU per kind, then the profiled window's top functions."""
    for key, runs in out.items():
        print(f"{key}: this process {statistics.median(runs):.3f} CPU-s (runs {[round(r, 3) for r in runs]})")
    print(f"window under cProfile: {profiled:.3f} CPU-s")
    print(f"Spark Connect server idle: {idle:.3f} core-s per second")
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(30)
    print(text.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="eos-profile-tasks-"))
    airflow_env(work / "airflow-home")
    import psutil
    import psycopg
    from baseline import _fresh_alo_table, at_least_once_dag, at_least_once_on_connect, run_at_least_once_in_airflow
    from measure import CpuMeter
    from records import HOUR, T0
    from windows import load_dags, run_exactly_once

    from airflow_eos.embedded import SparkConnectServer, kafka_service, postgres_service
    from airflow_eos.examples.transforms import PARTITIONED_ORDERS_TABLE_DDL

    with kafka_service() as kafka, postgres_service() as pg, SparkConnectServer("local[2]") as connect:
        ends = _prepare(kafka.address, pg.address, args.size)
        dags = load_dags()
        alo_dag = at_least_once_dag()
        conn = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect.port}
        server = next(p for p in psutil.Process().children() if "org.apache.spark" in " ".join(p.cmdline()))

        def server_cpu():
            return sum(sum(p.cpu_times()[:2]) for p in (server, *server.children(recursive=True)))

        meter = CpuMeter(pg.address)

        def window(j, profile=None):
            from psycopg.conninfo import make_conninfo

            with psycopg.connect(pg.address, autocommit=True) as c:
                c.execute(f'CREATE DATABASE "profile_w{j}"')
            url = make_conninfo(pg.address, dbname=f"profile_w{j}")
            with psycopg.connect(url, autocommit=True) as c:
                c.execute(PARTITIONED_ORDERS_TABLE_DDL)
            cpu = time.process_time()
            if profile:
                profile.enable()
            run_exactly_once(dags["orders_hourly_partitioned"], args.size, url, T0 + HOUR * (2 + j),
                             conn, "analytics.orders_partitioned", meter)
            if profile:
                profile.disable()
            return time.process_time() - cpu

        def alo_task(j):
            cpu = time.process_time()
            run_at_least_once_in_airflow(alo_dag, args.size, pg.address, kafka.address, ends,
                                         f"alo-t-{uuid.uuid4().hex[:6]}", connect.url, T0 + HOUR * (40 + j))
            return time.process_time() - cpu

        def alo_client(j):
            _fresh_alo_table(pg.address)
            cpu = time.process_time()
            at_least_once_on_connect(connect.url, pg.address, kafka.address, f"alo-c-{uuid.uuid4().hex[:6]}",
                                     ends, f"alo_{args.size}")
            return time.process_time() - cpu

        window(100)
        alo_task(100)
        alo_client(100)  # warm
        out = {"window": [], "alo_task": [], "alo_client": []}
        for j in range(args.repeats):
            out["window"].append(window(j))
            out["alo_task"].append(alo_task(j))
            out["alo_client"].append(alo_client(j))
        # One more window under cProfile, timed by this process's CPU clock (not the wall).
        profile = cProfile.Profile(time.process_time)
        profiled = window(args.repeats, profile)
        before = server_cpu()
        time.sleep(5)
        idle = (server_cpu() - before) / 5
    _report(out, profiled, idle, profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
