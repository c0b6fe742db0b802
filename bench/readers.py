"""The two readers of the stage job side by side on the same records, in one run:
Spark's own Kafka source (``reader="spark"``, spark/kafka_native.py) and the
eos_kafka Python data source (``reader="python"``, spark/kafka_source.py).

For each reader: the read ceiling (count() of the planned ranges, warm, in an
in-process ``local[cores]`` session: ceilings.spark_read) and the Spark side of
an exactly-once window (run_stage with the example orders transform into a
PostgresTarget, each run a new window and table; then into a FileTarget,
Spark's own Parquet writer; warm session), both in core-seconds of every process of the run (CpuMeter ``ours``:
this process, the JVM and its Python workers, PostgreSQL, the broker). On a
machine shared with other work only core-seconds compare; wall seconds are
printed beside them, marked with the load average.

    .venv/bin/python bench/readers.py --size 1000000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ceilings import spark_read  # noqa: E402
from measure import CpuMeter, checkpoint  # noqa: E402
from records import HOUR, PARTITIONS, T0, TOPIC, produce  # noqa: E402

from airflow_eos.spark.submit import DEFAULT_READER, READERS  # noqa: E402


def stage_window(spark, reader: str, url: str, bootstrap: str, ends: dict[int, int], k: int, meter: CpuMeter,
                 files: Path | None = None) -> dict:
    """The Spark side of one exactly-once window (plan frozen beforehand, not
    measured): run_stage of the orders transform into a fresh table of ``url``,
    or with ``files`` into a FileTarget there (Spark's own Parquet writer)."""
    import psycopg

    from airflow_eos import FileTarget, PostgresTarget
    from airflow_eos.core.ledger import Ledger
    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
    from airflow_eos.examples.transforms import ORDERS_TABLE_DDL
    from airflow_eos.spark import run_stage

    table = f"analytics.orders_{reader}_{k}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(ORDERS_TABLE_DDL.replace("analytics.orders", table))
    window = Window(f"bench_{reader}_{k}{'_files' if files else ''}", T0 + k * HOUR, T0 + (k + 1) * HOUR)
    plan = WindowPlan(window, tuple(PartitionRange(TOPIC, p, 0, e) for p, e in sorted(ends.items())))
    ledger = Ledger(url)
    ledger.migrate()
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, plan.pipeline)
        ledger.freeze(conn, plan, [])
    if files:
        (files / f"{reader}_{k}").mkdir(parents=True)
    target = (FileTarget(path=str(files / f"{reader}_{k}"), ledger_url=url) if files
              else PostgresTarget(url, table)).sink()
    attempt = target.begin(plan.window)
    checkpoint(url)
    with meter.measure() as cpu:
        report = run_stage(spark, plan, attempt, target, {"bootstrap.servers": bootstrap},
                           "airflow_eos.examples.transforms:orders", max_records_per_task=1_000_000,
                           max_bad_records=sum(ends.values()), reader=reader)
    assert report.records_read == sum(ends.values()), report
    return {"wall_s": cpu.seconds["wall"], "core_s": cpu.seconds["ours"], "cpu_s": cpu.seconds,
            "rows_staged": report.rows_staged}


def measure_reader(reader: str, url: str, bootstrap: str, ends: dict[int, int], cores: int, repeats: int,
                   meter: CpuMeter, files: Path) -> dict:
    """``reader``'s read ceiling, then the Spark side of its windows (stage_windows)."""
    size = sum(ends.values())
    read = spark_read(bootstrap, {size: ends}, {size: TOPIC}, cores, meter, runs=repeats, reader=reader)
    out = {"ceiling_read": {"wall_s": read[size], "core_s": read[("cpu", size)]["ours"],
                            "cpu_s": read[("cpu", size)]}}
    print(f"  {reader}: read ceiling {out['ceiling_read']['core_s']:.2f} core-s ({read[size]:.2f}s wall, loaded)",
          flush=True)
    out.update(stage_windows(reader, url, bootstrap, ends, cores, repeats, meter, files))
    return out


def stage_windows(reader: str, url: str, bootstrap: str, ends: dict[int, int], cores: int, repeats: int,
                  meter: CpuMeter, files: Path) -> dict:
    """The Spark side of ``repeats`` windows read by ``reader`` in one warm
    in-process session, into PostgreSQL then into Parquet files: the median
    of each (``window_stage``, ``window_stage_files``)."""
    from airflow_eos.spark import spark_session, stop_session

    spark = spark_session(f"eos-bench-stage-{reader}", master=f"local[{cores}]")
    try:
        spark.sparkContext.setLogLevel("ERROR")
        stage_window(spark, reader, url, bootstrap, ends, 100, meter)  # warm: workers, imports, JIT
        runs = [stage_window(spark, reader, url, bootstrap, ends, k, meter) for k in range(repeats)]
        print(f"  {reader}: window_stage runs {[round(r['core_s'], 2) for r in runs]} core-s", flush=True)
        stage_window(spark, reader, url, bootstrap, ends, 99, meter, files)  # warm: the Parquet writer
        file_runs = [stage_window(spark, reader, url, bootstrap, ends, 50 + k, meter, files) for k in range(repeats)]
    finally:
        stop_session(spark)
    out = {}
    for key, done in (("window_stage", runs), ("window_stage_files", file_runs)):
        out[key] = {"core_s": statistics.median(r["core_s"] for r in done),
                    "wall_s": statistics.median(r["wall_s"] for r in done), "runs": done}
    return out


def measure_readers(bench, ends: dict[int, int], url: str) -> dict:
    """bench/run.py's part (§2f): both readers' windows on the run's records,
    ``bench.repeats`` each, into a database of the run's (``url``); their read
    ceilings are §1's."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="eos-bench-readers-") as files:
        for reader in READERS:
            out[reader] = stage_windows(reader, url, bench.bootstrap, ends, bench.cores, bench.repeats,
                                        bench.meter, Path(files))
            print(f"   reader {reader}: window stage {out[reader]['window_stage']['core_s']:.2f} core-s "
                  f"({out[reader]['window_stage']['wall_s']:.2f}s), into files "
                  f"{out[reader]['window_stage_files']['core_s']:.2f} core-s "
                  f"({out[reader]['window_stage_files']['wall_s']:.2f}s)", flush=True)
    return out


def readers_section(res: dict) -> str:
    """§2f, when the run measured both readers' windows (an older results.json did not)."""
    from report import _rate, _secs, _table

    if not any("readers" in r for r in res["sizes"].values()):
        return ""
    head, row = _table(res)

    def figure(reader, key, what):
        return lambda r: f"{r['readers'][reader][key][what]:.2f}" if what == "core_s" \
            else _secs(r["readers"][reader][key][what])

    def read(reader):
        ceiling = "ceiling_spark_read" if reader == DEFAULT_READER else f"ceiling_spark_read_{reader}"
        return lambda r: f"{_rate(r[ceiling]['records_per_s'])}, {r[ceiling]['cpu_s']['ours']:.2f} core-s"

    lines = [
        "\n## 2f. The two readers side by side (bench/readers.py, in this run)\n\n",
        ("The Spark side of an exactly-once window (run_stage of the plan, frozen beforehand: read, the example "
        "orders transform, stage, checkpoint) with each reader: Spark's own Kafka source (`spark`) and the "
        "eos_kafka Python data source (`python`), in a warm in-process `local[2]` session, into a fresh "
        "PostgreSQL table, then into a FileTarget (Spark's own Parquet writer); `--repeats` windows of each, "
        "the median. Core-seconds of every process of the run (CpuMeter `ours`), which compare even on a "
        "machine shared with other work; wall seconds beside them. The read ceilings are §1's.\n\n"),
        head,
    ]
    for reader in READERS:
        lines += [
            row(f"`{reader}`: read ceiling (§1, count(), warm)", read(reader)),
            row(f"`{reader}`: window's Spark side into PostgreSQL, core-seconds",
                figure(reader, "window_stage", "core_s")),
            row("… wall time", figure(reader, "window_stage", "wall_s")),
            row(f"`{reader}`: window's Spark side into Parquet files, core-seconds",
                figure(reader, "window_stage_files", "core_s")),
            row("… wall time", figure(reader, "window_stage_files", "wall_s")),
        ]
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    from airflow_eos.embedded import kafka_service, postgres_service

    load = os.getloadavg()
    results: dict = {"size": args.size, "load_at_start": load, "readers": {}}
    with kafka_service() as kafka, postgres_service() as pg, tempfile.TemporaryDirectory() as files:
        meter = CpuMeter(pg.address)
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": kafka.address})
        for f in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            f.result(15)
        started = time.perf_counter()
        ends = produce(kafka.address, TOPIC, args.size, PARTITIONS)
        print(f"readers: {args.size:,} records produced in {time.perf_counter() - started:.1f}s; load {load}",
              flush=True)
        for reader in READERS:
            r = results["readers"][reader] = measure_reader(reader, pg.address, kafka.address, ends, args.cores,
                                                           args.repeats, meter, Path(files))
            for key in ("window_stage", "window_stage_files"):
                print(f"  {reader}: {key} {r[key]['core_s']:.2f} core-s ({r[key]['wall_s']:.2f}s wall, loaded)",
                      flush=True)
    results["load_at_end"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main", "measure_reader", "measure_readers", "readers_section", "stage_window", "stage_windows"]
