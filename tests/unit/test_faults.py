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


@pytest.mark.parametrize("code", [
    # set in the environment (EOS_FAULTS)
    "import os; os.environ['EOS_FAULTS']='abort.inside=crash'\n"
    "from airflow_eos.core.faults import fault_point\n"
    "try:\n    fault_point('abort.inside')\nfinally:\n    print('finally ran')",
    # injected in the thread (faults.injected)
    "from airflow_eos.core.faults import fault_point, injected\n"
    "try:\n    with injected('abort.inside=crash'):\n        fault_point('abort.inside')\n"
    "finally:\n    print('finally ran')",
], ids=["environment", "injected"])
def test_crash_ends_the_process_without_cleanup(code):
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


def test_injected_faults_fire_in_the_calling_thread_only(monkeypatch, tmp_path):
    import threading

    from airflow_eos.core.faults import injected

    monkeypatch.delenv("EOS_FAULTS", raising=False)
    seen = {}

    def other_thread():
        try:
            fault_point("commit.after_publish")
            seen["other"] = "no fault"
        except FaultInjected:
            seen["other"] = "fault"

    with injected("commit.after_publish=raise"):
        with pytest.raises(FaultInjected, match="commit.after_publish"):
            fault_point("commit.after_publish")
        fault_point("commit.before_publish")  # other points untouched
        thread = threading.Thread(target=other_thread)  # started inside the block: a context of its own
        thread.start()
        thread.join()
    assert seen == {"other": "no fault"}
    fault_point("commit.after_publish")  # the block is over


def test_injected_faults_count_firings_in_their_state_dir(monkeypatch, tmp_path):
    from airflow_eos.core.faults import injected

    monkeypatch.delenv("EOS_FAULTS_STATE", raising=False)
    fired = 0
    for _ in range(4):  # a block per try, as a retried step: the count survives the blocks
        with injected("stage.mid_write=raise*2", tmp_path / "w0"):
            try:
                fault_point("stage.mid_write")
            except FaultInjected:
                fired += 1
    assert fired == 2
    assert sorted(p.name for p in (tmp_path / "w0").iterdir()) == ["stage.mid_write.0", "stage.mid_write.1"]
    with pytest.raises(ConfigurationError, match=r"counts firings; pass injected\(spec, state_dir\)"):
        with injected("stage.mid_write=raise*1"):
            pass
    with pytest.raises(ConfigurationError, match="unknown fault point"):
        with injected("stage.typo=raise"):
            pass


def test_injected_faults_replace_the_environments_and_restore_them(monkeypatch):
    from airflow_eos.core.faults import injected

    monkeypatch.setenv("EOS_FAULTS", "abort.inside=raise")
    with injected(""):
        fault_point("abort.inside")  # the block says: no faults here
    with injected("plan.after_freeze=raise"):
        fault_point("abort.inside")
        with pytest.raises(FaultInjected):
            fault_point("plan.after_freeze")
    with pytest.raises(FaultInjected, match="abort.inside"):
        fault_point("abort.inside")  # EOS_FAULTS again

