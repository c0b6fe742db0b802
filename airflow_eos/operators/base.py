"""What the operators of a window share: the window's default bounds (the run's
data interval) and the hooks of an operator that works on a target."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from airflow_eos.core.target import TargetSpec

# The hooks are imported when a task runs: they load the Kafka and Postgres
# providers' clients, which parsing a DAG must not.
if TYPE_CHECKING:
    from airflow_eos.core.sink import Sink
    from airflow_eos.hooks.eos import EosTargetHook

DATA_INTERVAL_START = "{{ data_interval_start }}"
DATA_INTERVAL_END = "{{ data_interval_end }}"


class TargetHooks:
    """The hooks of an operator that works on a target (``self.target``)."""

    target: TargetSpec

    @cached_property
    def target_hook(self) -> "EosTargetHook":
        from airflow_eos.hooks.eos import EosTargetHook

        return EosTargetHook(self.target)

    @property
    def sink(self) -> "Sink":
        return self.target_hook.sink
