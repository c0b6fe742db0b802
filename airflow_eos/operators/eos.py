"""Operators of a window's life: thin shells over airflow_eos.steps.

plan → stage → (await_checkpoint, in sensors/) → commit, and abort as the
window's teardown. Each turns Airflow connections into plain values with its
hooks (``@cached_property``) and calls one step; the protocol lives in the steps,
the core and the target. An error that a retry cannot cure (``terminal`` in
core/errors.py) fails the task without using its retries.

One module per step (``plan.py``, ``stage.py``, ``commit.py``: commit and
abort); this one is the import path DAGs use.
"""

from __future__ import annotations

from airflow_eos.operators.base import DATA_INTERVAL_END, DATA_INTERVAL_START
from airflow_eos.operators.commit import EosAbortOperator, EosCommitOperator
from airflow_eos.operators.plan import EosPlanWindowOperator
from airflow_eos.operators.stage import EosSparkStageOperator

__all__ = [
    "DATA_INTERVAL_END",
    "DATA_INTERVAL_START",
    "EosAbortOperator",
    "EosCommitOperator",
    "EosPlanWindowOperator",
    "EosSparkStageOperator",
]
