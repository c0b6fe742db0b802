"""How ``make test`` spreads the suite over pytest-xdist workers.

``--dist loadfile`` hands whole modules to the workers in collection order, a
new one to whichever worker is free; the suite ends when the last module does.
Handing out the slowest modules first (longest processing time first) lets the
short ones fill the gaps at the end. SLOWEST_FIRST is that order, as measured
in a fresh-clone run (pytest's ``--junitxml`` times summed per module); a
module not named comes after them, in the order pytest collected it.
"""

from __future__ import annotations

import os

# Measured in the fresh-clone run of 2026-11-27 22:52 UTC (run L: --junitxml times summed per module, every
# module of 14 s or more; randomized 430 s, live_stack 400 s, ...). `make test-fast` takes modules in the same
# order: a module missing here is handed out last (test_sink_contract, unnamed before, ended a test-fast run
# 60 s after the other workers).
SLOWEST_FIRST = (
    "tests/chaos/test_randomized.py",
    "tests/e2e/test_live_stack.py",
    "tests/e2e/test_files_dag.py",
    "tests/e2e/test_orders_dag.py",
    "tests/e2e/test_iceberg_dag.py",
    "tests/integration/test_spark_stage.py",
    "tests/e2e/test_kafka_dag.py",
    "tests/chaos/test_files_faults.py",
    "tests/integration/test_sink_contract.py",
    "tests/integration/test_kafka_marker_expiry.py",
    "tests/chaos/test_external_faults.py",
    "tests/integration/test_spark_avro_source.py",
    "tests/integration/test_spark_stage_open_transaction.py",
    "tests/chaos/test_races_and_restarts.py",
    "tests/integration/test_spark_stage_files.py",
    "tests/integration/test_verify.py",
    "tests/e2e/test_demo.py",
    "tests/integration/test_plan.py",
    "tests/chaos/test_matrix_iceberg.py",
    "tests/integration/test_cli.py",
    "tests/chaos/test_spark_faults.py",
    "tests/integration/test_avro_pipeline.py",
    "tests/integration/test_load.py",
    "tests/e2e/test_standalone_cluster.py",
    "tests/chaos/test_matrix_kafka.py",
    "tests/e2e/test_spark_connect.py",
    "tests/integration/test_sink_kafka.py",
    "tests/integration/test_spark_source.py",
    "tests/chaos/test_kafka_faults.py",
    "tests/integration/test_spark_files_faults.py",
    "tests/integration/test_bad_input.py",
    "tests/chaos/test_matrix_files_hdfs.py",
    "tests/e2e/test_lineage.py",
    "tests/integration/test_spark_stage_kafka.py",
    "tests/chaos/test_broker_unreachable.py",
    "tests/chaos/test_matrix_postgres.py",
    "tests/chaos/test_matrix_files.py",
    "tests/e2e/test_spark_connect_files.py",
    "tests/chaos/test_transactional_source.py",
    "tests/integration/test_sink_postgres.py",
    "tests/integration/test_hdfs_files.py",
    "tests/unit/test_imports.py",
    "tests/chaos/test_airflow_faults.py",
    "tests/unit/test_cut_search.py",
    "tests/integration/test_sink_iceberg.py",
)
_RANK = {path: n for n, path in enumerate(SLOWEST_FIRST)}

# Modules longer than a worker's share, handed out a unit per contract target (the part of a test's id in
# brackets, up to the fault point) instead of whole: test_sink_contract ran 260 s on one of test-fast's
# workers and ended 15 s after the others. Their tests share no module-scoped fixture, so nothing is set
# up twice.
SPLIT_BY_TARGET = ("tests/integration/test_sink_contract.py",)

_config = None


def configure(config) -> None:
    """Remember the session's config, to tell later whether this process is an xdist controller."""
    global _config
    _config = config


def is_controller() -> bool:
    """Whether this process is an xdist controller (it runs no test). Asked after
    pytest_configure: xdist registers its controller's session plugin last."""
    return _config is not None and _config.pluginmanager.getplugin("dsession") is not None


def rank(item) -> int:
    """An item's module's place in SLOWEST_FIRST (unnamed modules after them)."""
    return _RANK.get(item.nodeid.split("::", 1)[0], len(SLOWEST_FIRST))


def scheduler(config, log):
    """``--dist loadfile``'s scheduling, with the modules of SPLIT_BY_TARGET split
    (pytest_xdist_make_scheduler); None for any other ``--dist``."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileSplittingLongModules(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return LoadFileSplittingLongModules(config, log)


def unit(nodeid: str) -> str:
    """The unit of work ``nodeid`` is handed out in: its module, or for a module
    of SPLIT_BY_TARGET, its module and contract target."""
    path, _, test = nodeid.partition("::")
    if path not in SPLIT_BY_TARGET or "[" not in test:
        return path
    from harness.sink_contract import CONTRACT_TARGETS

    param = test.split("[", 1)[1].rstrip("]")
    target = max((name for name in CONTRACT_TARGETS if param == name or param.startswith(name + "-")),
                 key=len, default=param)
    return f"{path}[{target}]"


# A soak runs for hours and pytest prints failures only at its end: with this
# set, each failure's report is appended to the file the moment it fails.
FAILLOG = os.environ.get("EOS_CHAOS_FAILLOG")


def log_failure(report) -> None:
    """Append a failed fault-suite test's report to EOS_CHAOS_FAILLOG, if set."""
    if FAILLOG:
        with open(FAILLOG, "a", encoding="utf-8") as out:
            out.write(f"==== {report.nodeid} [{report.when}]\n{report.longreprtext}\n")
