"""Cheap imports: what the provider costs every Airflow process, and what a DAG
file costs the DAG processor on every parse.

Every Airflow process (scheduler, workers, API server, triggerer, DAG processor)
imports ``airflow_eos.provider_info`` through the provider entry point, and the
DAG processor parses each DAG file again and again; the clients a window needs
(pyspark, pyarrow, psycopg, confluent_kafka) belong to the tasks that run it.
Each case runs in a fresh interpreter or a process forked from one (the test
process has them all loaded) and asserts the module set, not a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
# Top-level packages that must stay out. psycopg2 is what the Postgres provider's
# hook loads: the hooks must not be imported at parse time either.
HEAVY = ("pyspark", "pyarrow", "pandas", "numpy", "psycopg", "psycopg2", "confluent_kafka")

# An expression, in the child interpreter: the HEAVY packages in its sys.modules.
_HEAVY_LOADED = f'sorted({{name.partition(".")[0] for name in sys.modules}} & set({HEAVY!r}))'
_REPORT = f"""
import json, sys
print(json.dumps({_HEAVY_LOADED}))
"""
DAG_FILES = sorted(DAGS.glob("*.py"))


def loaded_heavy_packages(code: str) -> list[str]:
    """The HEAVY packages in sys.modules after running ``code`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", code + _REPORT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_provider_entry_point_imports_no_client_library():
    code = "import airflow_eos.provider_info\nairflow_eos.provider_info.get_provider_info()"
    assert loaded_heavy_packages(code) == []


def test_the_public_names_are_still_there_and_the_specs_are_cheap():
    """``from airflow_eos import ...`` (what a DAG file does) loads the specs,
    not the clients that run a window."""
    code = ("from airflow_eos import FileTarget, KafkaSource, PostgresTarget\n"
            "PostgresTarget(table='analytics.orders', postgres_conn_id='pg').target_id\n"
            "FileTarget(path='/data/lake/orders', postgres_conn_id='pg').target_id\n"
            "KafkaSource(topics=['orders'])")
    assert loaded_heavy_packages(code) == []


# Parsed as the DAG processor does: ``import airflow`` and the DagBag once, then each file in a
# process forked from that one (as Airflow 3's DAG processor forks one per parse), so the airflow
# import is paid once, not once per file.
_PARSE_EACH_FORKED = f"""
import json, os, sys
import airflow
from airflow.models.dagbag import DagBag

parsed = {{}}
for path in sys.argv[1:]:
    read, write = os.pipe()
    if os.fork() == 0:
        try:
            os.close(read)
            bag = DagBag(dag_folder=path)
            report = {{"errors": {{f: str(e) for f, e in bag.import_errors.items()}}, "dag_ids": bag.dag_ids,
                      "heavy": {_HEAVY_LOADED}}}
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        parsed[os.path.basename(path)] = json.loads(answer.read() or "null")
    os.wait()
print(json.dumps(parsed))
"""


@pytest.fixture(scope="module")
def parsed_example_dags() -> dict:
    """Per example DAG file: its parse's import errors, DAG ids and the HEAVY packages loaded
    (``import airflow``'s included); None if its process died (its traceback under ``stderr``)."""
    done = subprocess.run([sys.executable, "-c", _PARSE_EACH_FORKED, *map(str, DAG_FILES)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr[-3000:]}


@pytest.mark.parametrize("dag_file", [p.name for p in DAG_FILES])
def test_parsing_an_example_dag_imports_no_client_library(dag_file, parsed_example_dags):
    """The file must really define its DAG, or the check proves nothing."""
    parsed = parsed_example_dags[dag_file]
    assert parsed is not None, f"parsing {dag_file} failed in its process: {parsed_example_dags['stderr']}"
    assert not parsed["errors"], parsed["errors"]
    assert parsed["dag_ids"], f"no DAG in {dag_file}"
    assert parsed["heavy"] == []
