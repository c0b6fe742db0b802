"""The wheel ships the product, not the test harness (issue 17, item 6): built
from the package's own files with ``uv build --wheel``, it holds no chaos
driver, live Airflow stack or leak check, and it holds the demo's DAG, which
``airflow_eos.demo`` finds where the wheel is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO_DAG = "airflow_eos/examples/dags/orders_hourly.py"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of what the build reads (pyproject.toml, README.md,
    airflow_eos/), so the build leaves no build/ folder in the repository."""
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH: `make setup` installs it"
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "airflow_eos", source / "airflow_eos",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([uv, "build", "--wheel", "--out-dir", str(out), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("airflow_eos-*.whl")
    return path


def test_the_wheel_has_the_demo_dag_and_no_test_harness(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert DEMO_DAG in names
    # what the demo runs on
    assert {f"airflow_eos/embedded/{m}.py" for m in ("__init__", "processes", "postgres", "kafka", "spark_connect")} \
        <= set(names)
    assert "airflow_eos/examples/transforms.py" in names  # what the demo's DAG runs
    harness = [n for n in names if n.rsplit("/", 1)[-1] in {"chaos.py", "airflow_stack.py", "leaks.py"}
               or n.startswith(("airflow_eos/testing/", "tests/", "harness/", "bench/"))]
    assert harness == [], f"the wheel ships test or benchmark code: {harness}"
    assert zipfile.ZipFile(wheel).read(DEMO_DAG) == (ROOT / DEMO_DAG).read_bytes()


def test_the_demo_finds_its_dag_where_the_wheel_is_installed(wheel, tmp_path):
    """The wheel unpacked as a site directory, and only it: ``-S`` skips the
    .pth files, so this checkout's editable install cannot answer instead; the
    virtualenv's site-packages stays on the path for the dependencies."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])
    code = ("import airflow_eos, airflow_eos.demo as demo; "
            "print(airflow_eos.__file__); print(demo.DAG_FOLDER); print(demo.DAG_FILE.is_file())")
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    package, folder, found = done.stdout.split()
    assert Path(package).is_relative_to(site), package
    assert Path(folder) == (site / "airflow_eos" / "examples" / "dags").resolve()
    assert found == "True"
    assert sorted(p.name for p in Path(folder).glob("*.py")) == ["orders_hourly.py"]
