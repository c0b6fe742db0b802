"""How fast is the stage job? Reading a window alone vs reading, transforming,
staging and checkpointing it, and what the commit then costs.

Starts an embedded Kafka-protocol broker and PostgreSQL (or uses EOS_KAFKA_BOOTSTRAP /
EOS_POSTGRES_URL), produces N records over P partitions, and measures in one
local Spark session:

- read:   read_plan(...).count() — the eos_kafka source alone (cold: first query;
          warm: median of a few);
- stage:  run_stage(...) for a fresh attempt each run — read + transform + COPY into
          the staging + the job commit's checkpoint — with these transforms:
            json  from_json into typed columns plus lineage (native Spark functions);
            raw   none: records staged as read (bytea key/value, timestamp, lineage);
            udf   the json parse as a safe_udf Python UDF (exceptions -> dead letters);
- commit: prepare (the barrier's checks) and commit (INSERT ... SELECT into the target).

Each stage run uses its own pipeline, so every commit publishes for the first
time. Every process started here is stopped here. Not a test: nothing is timed
against a limit; counts are checked.

    .venv/bin/python bench/bench_stage.py --records 1000000 --json bench/results/stage.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient, NewTopic

from airflow_eos.core.ledger import Ledger
from airflow_eos.core.postgres_target import PostgresTarget
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.testing.services import kafka_service, postgres_service

sys.path.insert(0, str(Path(__file__).parent))
from bench_read import produce  # the sibling benchmark's producer: the same records

WINDOW_START = datetime(2024, 1, 1, tzinfo=timezone.utc)

TABLES = {
    "json": """CREATE TABLE bench_json (
        id bigint NOT NULL, pad text,
        eos_topic text NOT NULL, eos_partition integer NOT NULL, eos_offset bigint NOT NULL,
        eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL)""",
    "raw": """CREATE TABLE bench_raw (
        key bytea, value bytea, "timestamp" timestamptz NOT NULL,
        eos_topic text NOT NULL, eos_partition integer NOT NULL, eos_offset bigint NOT NULL,
        eos_pipeline text NOT NULL, eos_window_start timestamptz NOT NULL)""",
}
TABLES["udf"] = TABLES["json"].replace("bench_json", "bench_udf")


def json_transform(df):
    from pyspark.sql import functions as F

    order = F.from_json(F.col("value").cast("string"), "id BIGINT, pad STRING")
    return df.select(order.alias("o"), "topic", "partition", "offset").select(
        F.col("o.id").alias("id"), F.col("o.pad").alias("pad"), F.col("topic").alias("eos_topic"),
        F.col("partition").alias("eos_partition"), F.col("offset").alias("eos_offset"))


def udf_transform(df):
    from pyspark.sql import functions as F

    from airflow_eos.spark import safe_udf

    @safe_udf("id bigint, pad string")
    def parse(value):
        order = json.loads(value)
        return order["id"], order["pad"]

    return df.select(parse("value").alias("o"), "key", "value", F.col("topic").alias("eos_topic"),
                     F.col("partition").alias("eos_partition"), F.col("offset").alias("eos_offset")
                     ).select("o.*", "key", "value", "eos_topic", "eos_partition", "eos_offset")


TRANSFORMS = {"json": json_transform, "raw": None, "udf": udf_transform}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="Spark's local[N]")
    parser.add_argument("--max-records-per-task", type=int, default=None,
                        help="default: one read task per partition")
    parser.add_argument("--runs", type=int, default=2, help="stage runs per transform (the first warms workers)")
    parser.add_argument("--read-runs", type=int, default=3, help="warm read-only runs (median reported)")
    parser.add_argument("--transforms", default="json,raw,udf",
                        help=f"comma-separated, of {', '.join(TRANSFORMS)}")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    transforms = [t.strip() for t in args.transforms.split(",") if t.strip()]
    unknown = [t for t in transforms if t not in TRANSFORMS]
    if unknown:
        parser.error(f"unknown transforms {unknown}")

    rows: list[dict] = []
    stage_runs: list[dict] = []
    with postgres_service() as pg, kafka_service() as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.address})
        topic = f"bench-stage-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
        database = f"eos_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(pg.address, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        url = pg.address.rpartition("/")[0] + "/" + database
        try:
            started = time.perf_counter()
            ends = produce(kafka.address, topic, args.records, args.partitions, args.value_bytes)
            rows.append(row("produce (1 producer)", args.records, time.perf_counter() - started))
            plan_ranges = tuple(PartitionRange(topic, p, 0, end) for p, end in sorted(ends.items()))
            Ledger(url).migrate()
            with psycopg.connect(url, autocommit=True) as conn:
                for name in transforms:
                    conn.execute(TABLES[name])
            rows += bench_spark(args, url, {"bootstrap.servers": kafka.address}, plan_ranges, transforms,
                                stage_runs)
        finally:
            admin.delete_topics([topic])[topic].result(30)
            with psycopg.connect(pg.address, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')

    broker = "external" if os.environ.get("EOS_KAFKA_BOOTSTRAP") else "embedded"
    print()
    print(f"{args.records:,} records of ~{args.value_bytes} B over {args.partitions} partitions, Spark local"
          f"[{args.cores}] on {os.cpu_count()} cores, broker {broker}, PostgreSQL "
          f"{'external' if os.environ.get('EOS_POSTGRES_URL') else 'embedded'}")
    print(f"{'what':<58} {'rows':>10} {'seconds':>8} {'rows/s':>10}")
    for r in rows:
        rate = f"{r['rows_per_s']:>10,.0f}" if r["rows"] else f"{'-':>10}"
        count = f"{r['rows']:>10,}" if r["rows"] else f"{'-':>10}"
        print(f"{r['what']:<58} {count} {r['seconds']:>8.2f} {rate}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "records": args.records, "partitions": args.partitions, "value_bytes": args.value_bytes,
            "spark_master": f"local[{args.cores}]", "cpu_count": os.cpu_count(), "broker": broker,
            "python": platform.python_version(), "measured_at": datetime.now(timezone.utc).isoformat(),
            "results": rows, "stage_runs": stage_runs,
        }, indent=2) + "\n")
        print(f"\nwritten to {args.json}")
    wrong = [r["what"] for r in rows if r.get("expected") is not None and r["rows"] != r["expected"]]
    if wrong:
        print(f"WRONG COUNT in: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


def row(what: str, n: int, seconds: float, expected: int | None = None) -> dict:
    return {"what": what, "rows": n, "seconds": round(seconds, 3),
            "rows_per_s": round(n / seconds) if n and seconds > 0 else None, "expected": expected}


def bench_spark(args, url: str, kafka_config: dict, ranges, transforms, stage_runs: list) -> list[dict]:
    from airflow_eos.spark import read_plan, run_stage, spark_session, stop_session

    read_options = {"max_records_per_task": args.max_records_per_task} if args.max_records_per_task else {}
    out = []
    started = time.perf_counter()
    spark = spark_session("eos-bench-stage", master=f"local[{args.cores}]")
    try:
        spark.sparkContext.setLogLevel("ERROR")
        out.append(row("spark session start", 0, time.perf_counter() - started))
        plan = WindowPlan(Window("bench_read", WINDOW_START, WINDOW_START + timedelta(hours=1)), ranges)
        records = plan.max_records  # no gaps: every offset holds a record
        started = time.perf_counter()
        n = read_plan(spark, plan, kafka_config, **read_options).count()
        out.append(row("read only: eos_kafka count() (cold)", n, time.perf_counter() - started, records))
        warm = []
        for _ in range(args.read_runs):
            started = time.perf_counter()
            n = read_plan(spark, plan, kafka_config, **read_options).count()
            warm.append((time.perf_counter() - started, n))
        seconds, n = sorted(warm)[len(warm) // 2]
        out.append(row(f"read only: eos_kafka count() (warm, median of {len(warm)})", n, seconds, records))

        for name in transforms:
            runs = []
            for i in range(args.runs):
                window = Window(f"bench_{name}_{i}", WINDOW_START, WINDOW_START + timedelta(hours=1))
                plan = WindowPlan(window, ranges)
                ledger = Ledger(url)
                with ledger.connect() as conn, conn.transaction():
                    ledger.lock_pipeline(conn, window.pipeline)
                    ledger.freeze(conn, plan, [])
                target = PostgresTarget(url, f"bench_{name}")
                attempt = target.begin(window)
                report = run_stage(spark, plan, attempt, target, kafka_config, TRANSFORMS[name],
                                   max_records_per_task=args.max_records_per_task or max(r.width for r in ranges))
                started = time.perf_counter()
                assert target.prepare(attempt).prepared
                prepared = time.perf_counter()
                result = target.commit(attempt)
                committed = time.perf_counter()
                runs.append((report, prepared - started, committed - prepared, result.published_rows))
                stage_runs.append({"transform": name, "run": i + 1, "report": report.to_dict(),
                                   "prepare_s": round(prepared - started, 3),
                                   "commit_s": round(committed - prepared, 3), "published_rows": result.published_rows})
            for i, (report, *_) in enumerate(runs):
                label = f"{name}: read+transform+stage+checkpoint (run {i + 1}{', cold' if i == 0 else ''})"
                out.append(row(label, report.rows_staged, report.seconds["job"], records))
            report, prepare_s, commit_s, published = runs[-1]
            out.append(row(f"{name}: prepare (run {len(runs)})", report.rows_staged, prepare_s))
            out.append(row(f"{name}: commit, INSERT ... SELECT (run {len(runs)})", published, commit_s, records))
            if len(runs) > 1:
                median = statistics.median(r.seconds["job"] for r, *_ in runs[1:])
                out.append(row(f"{name}: read+transform+stage+checkpoint (warm median)", records, median))
    finally:
        stop_session(spark)
    return out


if __name__ == "__main__":
    sys.exit(main())
