"""The Iceberg target (issue 38): the same window as the headline, committed
into an Apache Iceberg table by ``IcebergTarget`` through ``dag.test`` of
dags/orders_hourly_iceberg.py on the same warm Spark Connect server (the
table in the SQL catalog the target keeps in the ledger's PostgreSQL), and
this target's ceiling: a plain pyiceberg ``table.append(arrow_table)`` of the
same rows into a fresh table of the same schema (no ledger, staging,
checkpoint, decision or commit token).

The ceiling's rows are the ones the window published, read back from its
table (a pyiceberg scan to Arrow, untimed): the same rows the window wrote,
without re-reading Kafka, so the ceiling times the append alone (Parquet
writing, manifests, one snapshot, the catalog's pointer swap).

The two run ``repeats`` times, interleaved (window, append, window, ...),
each window with a ledger database of its own (so a catalog and a table of
its own) under an empty warehouse. Every run is checked: the table's current
snapshot holds exactly the window's records, once each (its lineage columns);
the append's table, the same number of rows. Also the section of results.md
that shows them (§2g)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from measure import checkpoint, median_run
from records import HOUR, biggest_window
from windows import run_exactly_once

DAG_ID = "orders_hourly_iceberg"
TABLE = "analytics.orders"  # the example DAG's default table
CEILING_TABLE = "bench_ceiling.orders"


def warehouse() -> Path:
    """The example DAG's warehouse (windows.airflow_env sets it under the work dir)."""
    return Path(os.environ["EOS_ORDERS_ICEBERG_WAREHOUSE"])


def ledger_catalog(url: str):
    """The SQL catalog the Iceberg target keeps in the ledger database at ``url``."""
    from airflow_eos.targets.iceberg.table import ledger_catalog_properties, load_catalog

    return load_catalog("airflow_eos", ledger_catalog_properties(url))


def current_rows(table):
    """The table's rows at its current snapshot (pyiceberg's scan), checked:
    each (topic, partition, offset) once, or an error."""
    rows = table.scan().to_arrow()
    distinct = rows.group_by(["eos_topic", "eos_partition", "eos_offset"]).aggregate([]).num_rows
    if distinct != rows.num_rows:
        raise RuntimeError(f"{table.name()}: {rows.num_rows - distinct} record(s) published more than once")
    return rows


def published_rows(url: str) -> int:
    """The rows the window committed into the example DAG's table: one append
    snapshot, the window's, whose rows are each record once."""
    table = ledger_catalog(url).load_table(TABLE)
    appends = [s for s in table.metadata.snapshots if s.summary.operation.value == "append"]
    if len(appends) != 1 or "eos.window-start" not in appends[0].summary.additional_properties:
        raise RuntimeError(f"{TABLE}: expected the window's one append snapshot, found {len(appends)}")
    return current_rows(table).num_rows


def pyiceberg_append(url: str, size: int, location: Path, meter) -> dict:
    """A plain pyiceberg append of the window's published rows (read back from
    its table, untimed) into a fresh table of the same schema in the same
    catalog. Timed around ``table.append`` only; the rows counted afterwards."""
    catalog = ledger_catalog(url)
    source = catalog.load_table(TABLE)
    rows = source.scan().to_arrow()
    catalog.create_namespace_if_not_exists(CEILING_TABLE.split(".")[0])
    shutil.rmtree(location, ignore_errors=True)
    table = catalog.create_table(CEILING_TABLE, source.schema(), location=f"file://{location}")
    try:
        with meter.measure() as cpu:
            table.append(rows)
        written = current_rows(catalog.load_table(CEILING_TABLE)).num_rows
    finally:
        catalog.drop_table(CEILING_TABLE)
        shutil.rmtree(location, ignore_errors=True)
    if written != size:
        raise RuntimeError(f"pyiceberg append wrote {written} rows, expected {size}")
    seconds = cpu.seconds["wall"]
    return {"seconds": seconds, "records_per_s": size / seconds, "cpu_s": cpu.seconds}


def measure_iceberg(bench, size: int, urls: dict[str, str], run_after) -> dict:
    """§2g of one size: the Iceberg target's window and the pyiceberg append,
    ``bench.repeats`` times interleaved, each window in a ledger database (so
    a SQL catalog and a table) of its own under an empty warehouse."""
    root = warehouse()
    scratch = Path(tempfile.mkdtemp(prefix="eos-bench-iceberg-"))
    windows, appends = [], []
    try:
        for j in range(bench.repeats):
            shutil.rmtree(root, ignore_errors=True)
            checkpoint(bench.pg_url)
            url = urls[f"iceberg_{j}"]
            windows.append(run_exactly_once(bench.dags[DAG_ID], size, url, run_after + j * HOUR / 16,
                                            bench.connect_conn, lambda: published_rows(url), bench.meter))
            appends.append(pyiceberg_append(url, size, scratch / f"run-{j}", bench.meter))
            print(f"   run {j + 1}/{bench.repeats}: iceberg window {windows[-1]['window_s']:.2f}s, "
                  f"phases { {k: round(v, 2) for k, v in windows[-1]['phases_s'].items()} }; "
                  f"pyiceberg append {appends[-1]['seconds']:.2f}s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return {"exactly_once_iceberg": median_run(windows, "window_s"),
            "ceiling_pyiceberg_append": median_run(appends, "seconds")}


def iceberg_ratios(r: dict) -> dict:
    """One size's Iceberg figures against its ceiling and the file target's window (§2c), in records/s."""
    ice, append = r["exactly_once_iceberg"], r["ceiling_pyiceberg_append"]
    out = {
        "iceberg_window_s": ice["window_s"],
        "pyiceberg_append_s": append["seconds"],
        # As e2e_over_ceiling: the window's records/s over the ceiling's.
        "iceberg_over_pyiceberg_append": append["seconds"] / ice["window_s"],
        "iceberg_overhead_vs_pyiceberg_append": ice["window_s"] / append["seconds"] - 1,
    }
    if "exactly_once_files" in r:
        out["iceberg_over_files_window"] = r["exactly_once_files"]["window_s"] / ice["window_s"]
    return out


def iceberg_headline(results: dict) -> dict:
    """results.json's top-level Iceberg figures, of the biggest window."""
    big = biggest_window(results)
    if "iceberg_window_s" not in big:
        return {}
    return {"iceberg_window_1m_seconds": big["iceberg_window_s"],
            "iceberg_over_pyiceberg_append_1m": big["iceberg_over_pyiceberg_append"],
            "iceberg_over_files_window_1m": big.get("iceberg_over_files_window"),
            "iceberg_commit_1m_seconds": big["exactly_once_iceberg"]["commit_core_s"]}


# --------------------------------------------------------------------------- results.md §2g


def iceberg_section(res: dict) -> str:
    """§2g, when the run measured the Iceberg target (an older results.json did not)."""
    from report import _pct, _rate, _runs, _secs, _share, _table

    if not any("exactly_once_iceberg" in r for r in res["sizes"].values()):
        return ""
    head, row = _table(res)

    def i(r):
        return r["exactly_once_iceberg"]

    def a(r):
        return r["ceiling_pyiceberg_append"]

    def phase(name):
        return lambda r: _share(i(r), i(r)["phases_s"][name])

    return "".join([
        "\n## 2g. The Iceberg target: the same window into an Iceberg table "
        "(dags/orders_hourly_iceberg.py, same server)\n\n",
        "The window of §2 committed by `IcebergTarget` (ledger in PostgreSQL, one database per run, the table in "
        "the SQL catalog the target keeps there) as one append snapshot of a fresh table under an empty "
        "warehouse: the stage job writes the transform's good rows with Spark's own Parquet writer under the "
        "attempt's staging prefix in the table's location, the job commit seals the file manifest into the "
        "ledger, the commit decides in one ledger transaction and then appends exactly the manifest's files in "
        "one snapshot whose summary carries the window and a commit token. Run through `dag.test` of the example "
        "DAG on the same warm Spark Connect server as §2, interleaved with the ceiling, `--repeats` times (the "
        "median run of each). Each run is checked: the table holds one append snapshot, the window's, whose rows "
        "(pyiceberg's scan of the current snapshot, its lineage columns) are exactly the window's records, once "
        "each. The ceiling is a plain pyiceberg `table.append(arrow_table)` of the same rows (the ones the window "
        "published, read back from its table to Arrow, untimed) into a fresh table of the same schema in the same "
        "catalog: pyiceberg's own Parquet write, manifests and one snapshot; no Kafka read, transform, ledger, "
        "staging, checkpoint, seal or token (timed around the append only; its rows counted after).\n\n",
        head,
        row("window time, plan start → commit end (the median run)", lambda r: _secs(i(r)["window_s"])),
        row("… every run, in order", lambda r: _runs(i(r)["runs"])),
        row("records/s", lambda r: _rate(i(r)["records_per_s"])),
        row("plan task", phase("plan")),
        row("stage task", phase("stage")),
        row("… of which Spark Connect session start/stop and the operator's begin",
            lambda r: _share(i(r), i(r)["stage_spark_submit_overhead_s"])),
        row("… of which job setup (checks, clear, plan, transform build)",
            lambda r: _secs(i(r)["stage_job_s"]["setup"])),
        row("… of which Spark job (read + transform + Parquet write)",
            lambda r: _share(i(r), i(r)["stage_job_s"]["job"])),
        row("… of which checkpoint (read coverage, manifest, seal)",
            lambda r: _secs(i(r)["stage_job_s"]["checkpoint"])),
        row("await_checkpoint task", phase("await_checkpoint")),
        row("commit task", phase("commit")),
        row("… of which the commit (decision + Iceberg append snapshot, core)",
            lambda r: _secs(i(r)["commit_core_s"])),
        row("Airflow between tasks", lambda r: _share(i(r), i(r)["airflow_gaps_s"])),
        row("peak RSS of the Spark Connect server's process tree",
            lambda r: f"{i(r)['stage_peak_rss_bytes'] / 2**20:,.0f} MiB"),
        row("plain pyiceberg append of the same rows (ceiling; the median run)", lambda r: _secs(a(r)["seconds"])),
        row("… every run, in order (interleaved with the windows)", lambda r: _runs(a(r)["runs"])),
        row("… records/s", lambda r: _rate(a(r)["records_per_s"])),
        row("file-target window (§2c), for comparison", lambda r: _secs(r["exactly_once_files"]["window_s"])),
        row("**Iceberg window / pyiceberg append (records/s)**",
            lambda r: f"**{r['iceberg_over_pyiceberg_append']:.3f}**"),
        row("Iceberg window overhead over the append (time − 1)",
            lambda r: _pct(r["iceberg_overhead_vs_pyiceberg_append"])),
        row("Iceberg window / file-target window (records/s)", lambda r: f"{r['iceberg_over_files_window']:.3f}"),
    ])
