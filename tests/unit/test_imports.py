"""Cheap imports: what the provider costs every Airflow process, and what a DAG
file costs the DAG processor on every parse.

Every Airflow process (scheduler, workers, API server, triggerer, DAG processor)
imports ``airflow_eos.provider_info`` through the provider entry point, and the
DAG processor parses each DAG file again and again; the clients a window needs
(pyspark, pyarrow, psycopg, confluent_kafka) belong to the tasks that run it.
Each case runs in a fresh interpreter (the test process has them all loaded)
and asserts the module set, not a time.
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

_REPORT = f"""
import json, sys
print(json.dumps(sorted({{name.partition(".")[0] for name in sys.modules}} & set({HEAVY!r}))))
"""


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


@pytest.mark.parametrize("dag_file", sorted(p.name for p in DAGS.glob("*.py")))
def test_parsing_an_example_dag_imports_no_client_library(dag_file):
    """Parsed as the DAG processor does (a DagBag of the file, after ``import
    airflow``); the file must really define its DAG, or the check proves nothing."""
    code = (f"import airflow\n"
            f"from airflow.models.dagbag import DagBag\n"
            f"bag = DagBag(dag_folder={str(DAGS / dag_file)!r})\n"
            f"assert not bag.import_errors, bag.import_errors\n"
            f"assert bag.dag_ids, 'no DAG in {dag_file}'\n")
    assert loaded_heavy_packages(code) == []
