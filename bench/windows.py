"""The exactly-once window end to end: the example DAGs run by ``dag.test``
(plan -> stage -> await_checkpoint -> commit) with env connections, in this
process. Phases from the task instances' timestamps; the stage job's report
and the commit's own seconds from the tasks' XCom (``steps.Staged`` and
``steps.Committed``); peak RSS of the Spark process tree; CPU by part."""

from __future__ import annotations

import json
import os
import runpy
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from measure import CpuMeter, TreeMemory
from records import HOUR, REPO, T0


def airflow_env(home: Path) -> None:
    """Before anything imports Airflow: a throwaway home, the repo's DAGs, SQLite."""
    os.environ.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # orders_hourly_files reads its root when its module is imported (load_dags).
        "EOS_ORDERS_FILES_ROOT": str(home.parent / "lake" / "orders"),
        # orders_hourly_iceberg reads its warehouse the same way.
        "EOS_ORDERS_ICEBERG_WAREHOUSE": str(home.parent / "lake" / "iceberg"),
    })


def use_database(url: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    pg = conninfo_to_dict(url)
    os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"] = json.dumps(
        {"conn_type": "postgres", "host": pg["host"], "port": int(pg["port"]), "login": pg["user"],
         "schema": pg["dbname"], "password": pg.get("password")})


def task_results(run) -> dict[str, dict]:
    """Each task instance's return value (its XCom), by task id: the plan, the
    stage step's ``Staged`` dict (its ``report`` is the stage job's report,
    from its EOS_STAGE_REPORT line or from run_stage on Spark Connect) and the
    commit step's ``Committed`` dict (``seconds``: the target's commit)."""
    return {ti.task_id: ti.xcom_pull(task_ids=ti.task_id, key="return_value") for ti in run.get_task_instances()}


def run_exactly_once(dag, size: int, url: str, run_after: datetime,
                     spark_connection: dict, table: str | Callable[[], int], meter: CpuMeter) -> dict:
    """One window of ``size`` records through ``dag`` (staged on
    ``spark_connection``) into ``url``'s ``table``, once it holds every record:
    its figures. ``table`` may instead count what another target published
    (the file target: the rows of the Parquet under its root)."""
    import psycopg

    use_database(url)
    os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(spark_connection)
    with TreeMemory(connect=spark_connection["conn_type"] == "spark_connect") as memory, meter.measure() as cpu:
        started = time.perf_counter()
        run = dag.test(logical_date=T0 + HOUR, run_after=run_after)
        wall = time.perf_counter() - started
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    if run.state != "success":
        raise RuntimeError(f"exactly-once run of {size} failed: {({k: str(t.state) for k, t in tis.items()})}")
    if callable(table):
        published = table()
    else:
        with psycopg.connect(url) as conn:
            published = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    if published != size:
        raise RuntimeError(f"exactly-once run published {published} rows, expected {size}")

    def span(task):
        ti = tis[f"window.{task}"]
        return ti.start_date, ti.end_date, (ti.end_date - ti.start_date).total_seconds()

    phases = {k: span(k)[2] for k in ("plan", "stage", "await_checkpoint", "commit")}
    window_s = (span("commit")[1] - span("plan")[0]).total_seconds()
    xcom = task_results(run)
    report = (xcom.get("window.stage") or {}).get("report")
    commit = xcom.get("window.commit")
    job = report["seconds"] if report else {}
    # The stage task minus the job's own run_stage: with spark-submit, its JVM and
    # session start, imports and session stop; on Spark Connect, the client
    # session's creation and stop. Both include the operator's begin (~10 ms).
    jvm_s = phases["stage"] - job["total"] if job else None
    return {
        "records": size, "window_s": window_s, "records_per_s": size / window_s, "dag_test_wall_s": wall,
        "phases_s": phases, "airflow_gaps_s": window_s - sum(phases.values()),
        "stage_job_s": job, "stage_spark_submit_overhead_s": jvm_s,
        "read_tasks": report["read_tasks"] if report else None,
        "read_seconds_summed": report["read_seconds"] if report else None,
        "commit_core_s": commit["seconds"] if commit else None,
        "stage_peak_rss_bytes": memory.peak, "cpu_s": cpu.seconds,
    }


def load_dags() -> dict:
    """Airflow's database, and the example DAGs the windows run."""
    from airflow.utils import db

    db.initdb()
    return {name: runpy.run_path(str(REPO / "dags" / f"{name}.py"))["dag"]
            for name in ("orders_hourly", "orders_hourly_partitioned", "orders_hourly_files", "orders_hourly_iceberg",
                          "orders_to_topic", "orders_hourly_avro")}
