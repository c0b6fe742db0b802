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
