"""The file target (issue 18): the same window as the headline, published into
Parquet by ``FileTarget`` through ``dag.test`` of dags/orders_hourly_files.py
on the same warm Spark Connect server, and this target's ceiling: Spark's own
Parquet write of the same rows (the planned ranges read by the package's
eos_kafka reader, the same transform, ``df.write.parquet`` into a temporary
directory; no ledger, staging, checkpoint or commit).

The two run ``repeats`` times, interleaved (window, write, window, ...), each
window into an empty root with a ledger database of its own; the median of
each is reported. Every run is checked: the root holds one published partition
directory (with its ``_eos_commit.json``) whose Parquet holds exactly the
window's records, once each; the native write, the same number of rows.
Also the section of results.md that shows them (§2c)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from measure import checkpoint, median_run
from records import HOUR, T0, TOPIC, biggest_window
from windows import run_exactly_once

DAG_ID = "orders_hourly_files"
# What the stage job writes for the orders transform: every column but eos_error, key and value.
FILES_COLUMNS = ("order_id", "customer", "amount", "eos_topic", "eos_partition", "eos_offset")


def files_root() -> Path:
    """The example DAG's root (windows.airflow_env sets it under the work dir)."""
    return Path(os.environ["EOS_ORDERS_FILES_ROOT"])


def parquet_rows(path: Path) -> int:
    """Rows of the Parquet under ``path`` as a reader sees them (names starting
    with ``_`` or ``.`` skipped), each (partition, offset) once, or an error."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table(
        columns=["eos_partition", "eos_offset"])
    distinct = table.group_by(["eos_partition", "eos_offset"]).aggregate([]).num_rows
    if distinct != table.num_rows:
        raise RuntimeError(f"{path}: {table.num_rows - distinct} record(s) published more than once")
    return table.num_rows


def published_rows(root: Path) -> int:
    """The rows the window published under ``root``: one partition directory,
    written by the commit (it holds ``_eos_commit.json``), and nothing else."""
    windows = sorted(e.name for e in root.iterdir() if not e.name.startswith(("_", ".")))
    if len(windows) != 1 or not (root / windows[0] / "_eos_commit.json").is_file():
        raise RuntimeError(f"{root}: expected one published window directory, found {windows}")
    return parquet_rows(root)


def native_write(spark, bootstrap: str, ends: dict[int, int], size: int, out: Path, meter) -> dict:
    """Spark's own Parquet write of the window's rows: eos_kafka read of the
    planned ranges, the orders transform, its good rows' file columns,
    ``df.write.parquet(out)``. Timed from building the DataFrame to the write's
    end; the rows counted afterwards."""
    from pyspark.sql import functions as F

    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
    from airflow_eos.examples.transforms import orders
    from airflow_eos.spark import read_plan

    plan = WindowPlan(Window("bench_native_parquet", T0, T0 + HOUR),
                      tuple(PartitionRange(TOPIC, p, 0, e) for p, e in sorted(ends.items())))
    shutil.rmtree(out, ignore_errors=True)
    with meter.measure() as cpu:
        rows = orders(read_plan(spark, plan, {"bootstrap.servers": bootstrap}))
        rows.where(F.col("eos_error").isNull()).select(*FILES_COLUMNS).write.parquet(str(out))
    written = parquet_rows(out)
    shutil.rmtree(out, ignore_errors=True)
    if written != size:
        raise RuntimeError(f"native Parquet write wrote {written} rows, expected {size}")
    seconds = cpu.seconds["wall"]
    return {"seconds": seconds, "records_per_s": size / seconds, "cpu_s": cpu.seconds}


def measure_files(bench, size: int, ends: dict[int, int], urls: dict[str, str], run_after) -> dict:
    """§2c of one size: the file target's window and the native write,
    ``bench.repeats`` times interleaved (after one untimed native write: the
    server's first Parquet write of a session, reported as ``cold_s``)."""
    from airflow_eos.spark.session import spark_session, stop_session

    root = files_root()
    scratch = Path(tempfile.mkdtemp(prefix="eos-bench-parquet-"))
    started = time.perf_counter()
    spark = spark_session("bench native parquet", remote=bench.connect_url)
    session_s = time.perf_counter() - started
    windows, writes = [], []
    try:
        cold = native_write(spark, bench.bootstrap, ends, size, scratch / "cold", bench.meter)["seconds"]
        for j in range(bench.repeats):
            shutil.rmtree(root, ignore_errors=True)  # each window into an empty root, as into a fresh ledger
            checkpoint(bench.pg_url)
            windows.append(run_exactly_once(bench.dags[DAG_ID], size, urls[f"files_{j}"], run_after + j * HOUR / 16,
                                            bench.connect_conn, lambda: published_rows(root), bench.meter))
            writes.append(native_write(spark, bench.bootstrap, ends, size, scratch / f"run-{j}", bench.meter))
            print(f"   run {j + 1}/{bench.repeats}: files window {windows[-1]['window_s']:.2f}s, "
                  f"phases { {k: round(v, 2) for k, v in windows[-1]['phases_s'].items()} }; "
                  f"native Parquet write {writes[-1]['seconds']:.2f}s", flush=True)
    finally:
        stop_session(spark)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    native = {**median_run(writes, "seconds"), "session_start_s": session_s, "cold_s": cold}
    return {"exactly_once_files": median_run(windows, "window_s"), "ceiling_native_parquet": native}


def files_ratios(r: dict) -> dict:
    """One size's file-target figures against its ceiling and the PostgreSQL window (§2)."""
    files, native, pg = r["exactly_once_files"], r["ceiling_native_parquet"], r["exactly_once"]
    return {
        "files_window_s": files["window_s"],
        "native_parquet_write_s": native["seconds"],
        # As e2e_over_ceiling: the window's records/s over the ceiling's.
        "files_over_native_parquet": native["seconds"] / files["window_s"],
        "files_overhead_vs_native_parquet": files["window_s"] / native["seconds"] - 1,
        "files_window_over_postgres_window": files["window_s"] / pg["window_s"],
    }


def files_headline(results: dict) -> dict:
    """results.json's top-level file-target figures, of the biggest window."""
    big = biggest_window(results)
    if "files_window_s" not in big:
        return {}
    return {"files_window_1m_seconds": big["files_window_s"],
            "files_over_native_parquet_1m": big["files_over_native_parquet"],
            "files_window_over_postgres_window_1m": big["files_window_over_postgres_window"],
            "files_commit_1m_seconds": big["exactly_once_files"]["commit_core_s"]}


# --------------------------------------------------------------------------- results.md §2c


def files_section(res: dict) -> str:
    """§2c, when the run measured the file target (an older results.json did not)."""
    from report import _pct, _rate, _runs, _secs, _share, _table

    if not any("exactly_once_files" in r for r in res["sizes"].values()):
        return ""
    head, row = _table(res)

    def f(r):
        return r["exactly_once_files"]

    def n(r):
        return r["ceiling_native_parquet"]

    def phase(name):
        return lambda r: _share(f(r), f(r)["phases_s"][name])

    return "".join([
        "\n## 2c. The file target: the same window into Parquet (dags/orders_hourly_files.py, same server)\n\n",
        "The window of §2 published by `FileTarget` (ledger in PostgreSQL, one database per run) as one "
        "`eos_window_start=…/` directory of Parquet under an empty root: the stage job writes the transform's "
        "good rows with Spark's own Parquet writer into the attempt's `_eos_staging`, the job commit seals the "
        "file manifest into the ledger, the commit decides in one ledger transaction and publishes by one "
        "directory rename. Run through `dag.test` of the example DAG on the same warm Spark Connect server as §2, "
        "interleaved with the ceiling, `--repeats` times (the median run of each). Each run is checked: the root "
        "holds one published directory (with its `_eos_commit.json`) whose Parquet has exactly the window's "
        "records, once each. The ceiling is Spark's native Parquet write of the same rows in a session of the "
        "same server: the planned ranges read by `eos_kafka`, the same transform, its good rows' columns, "
        "`df.write.parquet` into a temporary directory; no ledger, staging, checkpoint, seal or commit, no "
        "dead-letter count (timed from building the DataFrame to the write's end; its rows counted after).\n\n",
        head,
        row("window time, plan start → commit end (the median run)", lambda r: _secs(f(r)["window_s"])),
        row("… every run, in order", lambda r: _runs(f(r)["runs"])),
        row("records/s", lambda r: _rate(f(r)["records_per_s"])),
        row("plan task", phase("plan")),
        row("stage task", phase("stage")),
        row("… of which Spark Connect session start/stop and the operator's begin",
            lambda r: _share(f(r), f(r)["stage_spark_submit_overhead_s"])),
        row("… of which job setup (checks, clear, plan, transform build)",
            lambda r: _secs(f(r)["stage_job_s"]["setup"])),
        row("… of which Spark job (read + transform + Parquet write)",
            lambda r: _share(f(r), f(r)["stage_job_s"]["job"])),
        row("… of which checkpoint (read coverage, manifest, seal)",
            lambda r: _secs(f(r)["stage_job_s"]["checkpoint"])),
        row("await_checkpoint task", phase("await_checkpoint")),
        row("commit task", phase("commit")),
        row("… of which the commit (decision + rename, core)", lambda r: _secs(f(r)["commit_core_s"])),
        row("Airflow between tasks", lambda r: _share(f(r), f(r)["airflow_gaps_s"])),
        row("peak RSS of the Spark Connect server's process tree",
            lambda r: f"{f(r)['stage_peak_rss_bytes'] / 2**20:,.0f} MiB"),
        row("native Spark Parquet write of the same rows (ceiling; the median run)",
            lambda r: _secs(n(r)["seconds"])),
        row("… every run, in order (interleaved with the windows)", lambda r: _runs(n(r)["runs"])),
        row("… records/s", lambda r: _rate(n(r)["records_per_s"])),
        row("… its session's first write (cold, not counted)", lambda r: _secs(n(r)["cold_s"])),
        row("PostgreSQL window (§2, partition attach), for comparison", lambda r: _secs(r["exactly_once"]["window_s"])),
        row("**files window / native Parquet write (records/s)**",
            lambda r: f"**{r['files_over_native_parquet']:.3f}**"),
        row("files window overhead over the native write (time − 1)",
            lambda r: _pct(r["files_overhead_vs_native_parquet"])),
        row("files window time / PostgreSQL window time (§2)",
            lambda r: f"{r['files_window_over_postgres_window']:.2f}×"),
    ])
