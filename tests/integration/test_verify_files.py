"""verify on the file target (issue 33): it sees what readers of the root see.
Windows are planned from the broker and staged with lineage read from Kafka
(``build`` of test_verify.py), published into a real directory with the ledger
in a real PostgreSQL; verify then reads the root as PyArrow and Spark do."""

from __future__ import annotations

import io
import os

import pytest

from airflow_eos import verify as v
from airflow_eos.cli.verify import print_report
from airflow_eos.targets.files import FileTarget
from airflow_eos.verify import verify
from test_verify import HOUR, PIPELINE, T0, build


@pytest.fixture
def lake(tmp_path, pg_url, ledger):
    root = tmp_path / "lake" / "orders"
    root.mkdir(parents=True)
    return FileTarget(path=str(root), ledger_url=pg_url).sink()


class DecideOnly:
    """The sink, except that the commit of ``window_start`` dies after its
    decision and a directory appears at the window's partition path before
    anyone publishes it."""

    def __init__(self, sink, window_start):
        self.sink, self.window_start = sink, window_start

    def __getattr__(self, name):
        return getattr(self.sink, name)

    def commit(self, attempt):
        if attempt.window_start != self.window_start:
            return self.sink.commit(attempt)
        self.sink.decide(attempt)
        os.makedirs(self.sink.partition_dir(attempt))


def kinds(report):
    return sorted(x.kind for x in report.violations)


def test_a_window_decided_and_not_published_is_reported_as_such(ledger, kafka_config, lake):
    build(ledger, kafka_config, DecideOnly(lake, T0 + HOUR), windows=2)
    report = verify(ledger, kafka_config, lake, PIPELINE)
    [unpublished] = [x for x in report.violations if x.kind == v.UNPUBLISHED]
    assert unpublished.window_start == T0 + HOUR
    assert "decided, not published" in unpublished.message and "retry the commit task" in unpublished.message
    assert kinds(report) == [v.COUNT] + [v.MISSING] * 6 + [v.UNPUBLISHED]  # its 6 records, and the row count
    assert [a.unpublished for a in report.windows] == [False, True]
    assert report.to_dict()["windows"][1]["published"] is False
    text = io.StringIO()
    print_report(report, text)
    assert "decided, not published" in text.getvalue()
