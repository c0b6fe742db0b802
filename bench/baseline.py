"""The at-least-once baseline: the same reader, transform
(airflow_eos.examples.transforms:orders) and Spark as the exactly-once window,
from the consumer group's committed offsets, COPY straight into a copy of the
target table from the write tasks, then a consumer-group offset commit; no
ledger, attempt, staging, read reports, checkpoint or publish step.

Three ways: a spark-submit of ``bench/run.py alo-job`` with the stage
operator's conf (as §2b), a Spark Connect client of the warm server (the
headline), and the same as the one task of an Airflow DAG (``dag.test``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from measure import CpuMeter, TreeMemory
from records import HERE, HOUR, T0, TARGET_COLUMNS, TOPIC

ALO_TABLE = "analytics.orders_alo"


def run_at_least_once(size: int, url: str, bootstrap: str, ends: dict[int, int], group: str) -> dict:
    """A spark-submit of ``bench/run.py alo-job`` (:func:`alo_job`) with the stage operator's conf."""
    from airflow_eos.spark.submit import stage_job_environment
    from airflow_eos.targets.postgres.target import PostgresTarget

    _fresh_alo_table(url)
    env = {**os.environ, **stage_job_environment(PostgresTarget(url, ALO_TABLE), {"bootstrap.servers": bootstrap},
                                                 local=True)}
    cmd = [str(Path(sys.executable).with_name("spark-submit")), "--master", "local[2]",
           "--conf", "spark.ui.enabled=false", "--name", "bench-at-least-once", str(HERE / "run.py"),
           "alo-job", "--url", url, "--bootstrap", bootstrap, "--group", group,
           "--ends", json.dumps(ends), "--pipeline", f"alo_{size}"]
    with TreeMemory() as memory:
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"at-least-once job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    report = next(json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                  if line.startswith("ALO_REPORT "))
    return _alo_result(size, url, wall, report, wall - report["total"], memory.peak)


def alo_job(argv: list[str]) -> int:
    """Under spark-submit: consume -> transform -> insert -> commit group offsets."""
    parser = argparse.ArgumentParser(prog="run.py alo-job")
    for name in ("--url", "--bootstrap", "--group", "--ends", "--pipeline"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    from airflow_eos.spark import spark_session, stop_session

    spark = spark_session("bench at-least-once")
    report = at_least_once(spark, args.url, args.bootstrap, args.group,
                           {int(p): e for p, e in json.loads(args.ends).items()}, args.pipeline, started)
    stop_session(spark)
    print("ALO_REPORT " + json.dumps(report), flush=True)
    return 0


def at_least_once(spark, url: str, bootstrap: str, group: str, ends: dict[int, int], pipeline: str,
                  started: float) -> dict:
    """The baseline's work in a session (spark-submit's or a Spark Connect one):
    from the group's committed offsets to ``ends``, the orders transform, COPY
    from the write tasks, then commit the group's offsets. Seconds since ``started``."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from pyspark.sql import functions as F

    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
    from airflow_eos.examples.transforms import orders
    from airflow_eos.spark import read_plan

    register_copy_sink(spark)
    session = time.perf_counter()
    config = {"bootstrap.servers": bootstrap}
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    committed = consumer.committed([KafkaTopicPartition(TOPIC, p) for p in sorted(ends)], timeout=30)
    plan = WindowPlan(Window(pipeline, T0, T0 + HOUR), tuple(
        PartitionRange(TOPIC, tp.partition, max(tp.offset, 0), ends[tp.partition]) for tp in committed))
    out = (orders(read_plan(spark, plan, config)).where(F.col("eos_error").isNull())
           .select(*TARGET_COLUMNS[:6], F.lit(pipeline).alias("eos_pipeline"),
                   F.lit(T0).cast("timestamp").alias("eos_window_start")))
    out.write.format("bench_copy").mode("append").options(url=url, table=ALO_TABLE).save()
    job = time.perf_counter()
    consumer.commit(offsets=[KafkaTopicPartition(TOPIC, p, e) for p, e in ends.items()], asynchronous=False)
    consumer.close()
    offsets = time.perf_counter()
    return {"setup": session - started, "job": job - session, "commit_offsets": offsets - job,
            "total": offsets - started}


def register_copy_sink(spark) -> None:
    """The ``bench_copy`` data source: each write task COPYs its rows into the
    table in one transaction (the sink's encoder: binary COPY), nothing else."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class CopyMessage(WriterCommitMessage):
        pass

    class CopyWriter(DataSourceArrowWriter):
        def __init__(self, options):
            self.url, self.table = options["url"], options["table"]

        def write(self, iterator):
            import itertools

            import psycopg
            from psycopg import sql

            from airflow_eos.staging.encoding import column_types, encoder_for

            batches = (b.select(list(TARGET_COLUMNS)) for b in iterator if b.num_rows)
            first = next(batches, None)
            if first is None:
                return CopyMessage()
            with psycopg.connect(self.url) as conn, conn.transaction(), conn.cursor() as cur:
                cur.execute("SET LOCAL TIME ZONE 'UTC'")
                encoder = encoder_for(first.schema, column_types(conn, sql.Identifier(*self.table.split("."))))
                with cur.copy(f"COPY {self.table} ({', '.join(TARGET_COLUMNS)}) FROM STDIN "
                              f"(FORMAT {encoder.option})") as cp:
                    cp.write(encoder.header())
                    for batch in itertools.chain([first], batches):
                        cp.write(encoder.encode(batch))
                    cp.write(encoder.trailer())
            return CopyMessage()

    class CopySource(DataSource):
        @classmethod
        def name(cls):
            return "bench_copy"

        def writer(self, schema, overwrite):
            return CopyWriter(self.options)

    spark.dataSource.register(CopySource)


def run_at_least_once_on_connect(size: int, url: str, bootstrap: str, ends: dict[int, int], group: str,
                                 remote: str, meter: CpuMeter) -> dict:
    """The same baseline as a Spark Connect client of the warm server the
    exactly-once stage used: both sides pay neither spark-submit nor JVM start."""
    _fresh_alo_table(url)
    with TreeMemory(connect=True) as memory, meter.measure() as cpu:
        report, wall = at_least_once_on_connect(remote, url, bootstrap, group, ends, f"alo_{size}")
    return {**_alo_result(size, url, wall, report, 0.0, memory.peak), "cpu_s": cpu.seconds}


def at_least_once_on_connect(remote: str, url: str, bootstrap: str, group: str, ends: dict[int, int],
                             pipeline: str) -> tuple[dict, float]:
    """The baseline in a session of its own on the Connect server: its report,
    and the seconds from the session's start to the offset commit."""
    from airflow_eos.spark.session import spark_session, stop_session

    started = time.perf_counter()
    spark = spark_session("bench at-least-once", remote=remote)
    try:
        report = at_least_once(spark, url, bootstrap, group, ends, pipeline, started)
        return report, time.perf_counter() - started
    finally:
        stop_session(spark)


_ALO_TASK: dict = {}  # the arguments of the baseline's Airflow task, set before its dag.test


def _alo_task() -> dict:
    return at_least_once_on_connect(**_ALO_TASK)[0]


def at_least_once_dag():
    """The baseline as a user would schedule it: one Airflow task doing all of it."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    with DAG("bench_at_least_once", schedule=None, start_date=T0, catchup=False) as dag:
        PythonOperator(task_id="at_least_once", python_callable=_alo_task)
    # dag.test runs only serialized DAGs; this one is in no DAG file: serialize it here.
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=os.devnull)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    return dag


def run_at_least_once_in_airflow(dag, size: int, url: str, bootstrap: str, ends: dict[int, int], group: str,
                                 remote: str, run_after: datetime) -> dict:
    """The same baseline as one task of a DAG run by dag.test; its time is the
    task instance's start to end, as the exactly-once window's is plan start to
    commit end."""
    _fresh_alo_table(url)
    _ALO_TASK.update(url=url, bootstrap=bootstrap, group=group, ends=ends, pipeline=f"alo_{size}", remote=remote)
    run = dag.test(logical_date=T0 + HOUR, run_after=run_after)
    [ti] = run.get_task_instances()
    if run.state != "success":
        raise RuntimeError(f"at-least-once Airflow task of {size} failed: {ti.state}")
    wall = (ti.end_date - ti.start_date).total_seconds()
    return _alo_result(size, url, wall, {}, 0.0, 0)


def _alo_result(size: int, url: str, wall: float, report: dict, start_up_s: float, peak_rss: int) -> dict:
    """A baseline run's figures, once its table holds every record exactly."""
    import psycopg

    with psycopg.connect(url) as conn:
        inserted = conn.execute(f"SELECT count(*) FROM {ALO_TABLE}").fetchone()[0]
    if inserted != size:
        raise RuntimeError(f"at-least-once job inserted {inserted} rows, expected {size}")
    return {"records": size, "wall_s": wall, "records_per_s": size / wall, "job_s": report,
            "spark_submit_overhead_s": start_up_s, "peak_rss_bytes": peak_rss}


def _fresh_alo_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {ALO_TABLE}")
        conn.execute(f"CREATE TABLE {ALO_TABLE} (LIKE analytics.orders INCLUDING ALL)")
