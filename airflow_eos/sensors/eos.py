"""The barrier of a window: await the stage attempt's checkpoint (``steps.prepare``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowException
from airflow_eos.core.target import TargetSpec, as_spec

# The hooks (and the trigger, which imports them) are imported when the sensor
# runs: they load the Postgres provider's client, which parsing a DAG must not.
if TYPE_CHECKING:
    from airflow_eos.hooks.eos import EosTargetHook


class EosCheckpointSensor(BaseSensorOperator):
    """Confirm the stage attempt's checkpoint is durable and complete, and mark
    the attempt prepared: every planned partition consumed to its end cut, the
    staged rows equal to the checkpoint's counts, the attempt not fenced by a
    newer one. Fails at once when waiting cannot help.

    :param target: the window's target spec (e.g. PostgresTarget)
    :param attempt: the stage task's attempt (its XCom; templated)
    :param deferrable: wait in the triggerer instead of a worker slot (default: Airflow's
        ``[operators] default_deferrable``)
    """

    template_fields: Sequence[str] = ("attempt",)
    ui_color = "#fff4e0"

    def __init__(
        self,
        *,
        target: TargetSpec,
        attempt: Any,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.target = as_spec(target)
        self.attempt = attempt
        self.deferrable = deferrable

    @cached_property
    def target_hook(self) -> "EosTargetHook":
        from airflow_eos.hooks.eos import EosTargetHook

        return EosTargetHook(self.target)

    def _attempt(self) -> dict[str, Any]:
        if not isinstance(self.attempt, dict):
            raise AirflowException(f"attempt must be the stage task's XCom (a dict), got {self.attempt!r}")
        return dict(self.attempt)

    def _prepared(self) -> bool:
        from airflow_eos import steps
        from airflow_eos.core.attempt import Attempt
        from airflow_eos.hooks.eos import failing_terminally

        with failing_terminally():
            return steps.prepare(self.target_hook.sink, Attempt.from_dict(self._attempt())).prepared

    def poke(self, context) -> PokeReturnValue:
        if not self._prepared():
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=self.attempt)

    def execute(self, context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        from airflow_eos.triggers.eos import CheckpointTrigger

        if self._prepared():
            return self.attempt
        self.defer(
            # The spec names connections only: the triggerer resolves them itself, no secret is serialised.
            trigger=CheckpointTrigger(poll_interval=self.poke_interval, target=self.target.to_dict(),
                                      attempt=self._attempt()),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        from airflow_eos.hooks.eos import reraise_event_error

        if event.get("status") != "done":
            reraise_event_error(event, f"the checkpoint of {self.attempt}")
        self.log.info("%s", event["detail"])
        return self.attempt
