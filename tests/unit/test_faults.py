import subprocess
import sys

import pytest

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.faults import FaultInjected, fault_point


def test_no_faults_when_unset(monkeypatch):
    monkeypatch.delenv("EOS_FAULTS", raising=False)
    fault_point("commit.after_publish")


def test_raise_every_time_and_counted_firings(monkeypatch, tmp_path):
    monkeypatch.setenv("EOS_FAULTS", "commit.after_publish=raise")
    for _ in range(3):
        with pytest.raises(FaultInjected, match="commit.after_publish"):
            fault_point("commit.after_publish")
    fault_point("commit.before_publish")  # other points untouched

    monkeypatch.setenv("EOS_FAULTS", "stage.mid_write=raise*2")
    monkeypatch.setenv("EOS_FAULTS_STATE", str(tmp_path))
    fired = 0
    for _ in range(5):
        try:
            fault_point("stage.mid_write")
        except FaultInjected:
            fired += 1
    assert fired == 2


def test_bad_specs_are_refused(monkeypatch):
    monkeypatch.setenv("EOS_FAULTS", "commit.typo=raise")
    with pytest.raises(ConfigurationError, match="unknown fault point"):
        fault_point("commit.after_publish")
    monkeypatch.setenv("EOS_FAULTS", "commit.after_publish=explode")
    with pytest.raises(ConfigurationError, match="must be 'raise' or 'crash'"):
        fault_point("commit.after_publish")
    monkeypatch.delenv("EOS_FAULTS_STATE", raising=False)
    monkeypatch.setenv("EOS_FAULTS", "commit.after_publish=raise*1")
    with pytest.raises(ConfigurationError, match="EOS_FAULTS_STATE"):
        fault_point("commit.after_publish")


def test_crash_ends_the_process_without_cleanup():
    code = ("import os; os.environ['EOS_FAULTS']='abort.inside=crash'\n"
            "from airflow_eos.core.faults import fault_point\n"
            "try:\n    fault_point('abort.inside')\nfinally:\n    print('finally ran')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 137
    assert "finally ran" not in res.stdout


def test_every_point_is_placed_in_the_code_and_every_placed_point_is_known():
    """A point in POINTS that no code reaches would make its chaos cells fail
    for the wrong reason; a call naming an unknown point would raise only when
    faults are set."""
    import re
    from pathlib import Path

    import airflow_eos
    from airflow_eos.core.faults import POINTS

    placed = set()
    for path in Path(airflow_eos.__file__).parent.rglob("*.py"):
        placed |= set(re.findall(r'fault_point\("([a-z_.]+)"\)', path.read_text()))
    assert placed - POINTS == set(), f"fault_point calls naming unknown points: {placed - POINTS}"
    assert POINTS - placed == set(), f"points no code reaches: {POINTS - placed}"
