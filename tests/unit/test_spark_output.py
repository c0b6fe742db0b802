"""How the stage job chooses its writer: through the Sink interface only
(Sink.spark_output), never by asking which target it has."""

from __future__ import annotations

import ast
import os
from datetime import datetime, timezone
from pathlib import Path

from airflow_eos.core.attempt import Attempt
from airflow_eos.core.sink import DEAD_LETTER_SCHEMA, Sink
from airflow_eos.targets.files import FileTarget
from airflow_eos.targets.files.writer import DEAD_LETTER_COLUMNS, dead_letter_schema
from airflow_eos.targets.postgres.target import PostgresTarget

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
SPARK = Path(__file__).resolve().parents[2] / "airflow_eos" / "spark"


def test_an_arrow_writer_sink_names_no_spark_output_and_no_not_null_columns_by_default():
    assert Sink.spark_output(object(), None) is None
    assert Sink.not_null_columns(object(), ["a"]) == []
    sink = PostgresTarget("postgresql://u@h/db", "analytics.orders").sink()
    assert sink.spark_output(None) is None


def test_a_file_sink_names_its_staging_folders_as_local_urls(tmp_path):
    sink = FileTarget(path=str(tmp_path), ledger_url="postgresql://u@h/db",
                      layout="p={pipeline}/eos_window_start={window_start}").sink()
    attempt = Attempt("orders", T0, T0.replace(hour=1), 3, "orders_202401010000_abc_e3")
    staging = os.path.join(sink.staging_dir(attempt))
    for sub in ("data", "dead_letters"):
        os.makedirs(os.path.join(staging, sub))
    output = sink.spark_output(attempt)
    assert output.data == f"file://{staging}/data" and output.dead_letters == f"file://{staging}/dead_letters"
    assert output.reserved == ("p", "eos_window_start")
    assert sink.not_null_columns(["a"]) == []


def test_the_dead_letter_files_spark_writes_have_the_file_targets_schema():
    assert tuple(name for name, _ in DEAD_LETTER_SCHEMA) == DEAD_LETTER_COLUMNS
    spark_to_arrow = {"string": "string", "int": "int32", "long": "int64", "binary": "binary"}
    assert [(n, spark_to_arrow[k]) for n, k in DEAD_LETTER_SCHEMA] == [
        (f.name, str(f.type)) for f in dead_letter_schema()]


def test_the_spark_job_never_asks_which_target_it_has():
    for path in SPARK.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                assert not names & {"PostgresTarget", "PostgresSink", "FileSink", "FileTarget"}, f"{path.name}: {ast.unparse(node)}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(m.startswith("airflow_eos.targets.files") for m in modules), path.name
        assert ".kind ==" not in path.read_text(), path.name


def test_a_full_disk_under_sparks_writer_is_said_first_with_the_place_and_what_to_do(tmp_path):
    from airflow_eos.spark.stage_files import _disk_full

    data = tmp_path / "lake" / "_eos_staging" / "a_e1" / "data"
    spark_error = ("An error occurred while calling o378.parquet.\n: org.apache.spark.SparkException: "
                   "[TASK_WRITE_FAILED] Task failed while writing rows to file:/x. SQLSTATE: 58030\n\tat org.apache."
                   "spark.sql.errors...\nCaused by: java.io.IOException: No space left on device\n\tat java.base/...")
    message = _disk_full(Exception(spark_error), f"file://{data}")
    mount = str(tmp_path)
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    assert message.startswith(f"the disk is full (No space left on device): Spark's Parquet writer could not write "
                              f"the window's files into {data}, on the file system mounted at {mount} ("), message
    assert "MiB free of" in message and message.endswith("then rerun the window: a retry of the stage task or a Clear")
    assert _disk_full(Exception("OSError: [Errno 122] Disk quota exceeded"), str(data)).startswith(
        "the disk is full (Disk quota exceeded)")
    assert _disk_full(Exception(spark_error.replace("No space left on device", "Permission denied")), str(data)) is None
