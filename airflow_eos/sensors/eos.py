"""The barrier of a window: await the stage attempt's checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException
from airflow_eos.targets.postgres.target import PostgresTarget

# The hooks (and the trigger, which imports them) are imported when the sensor
# runs: they load the Postgres provider's client, which parsing a DAG must not.


class EosCheckpointSensor(BaseSensorOperator):
    """Confirm the stage attempt's checkpoint is durable and complete, and mark
    the attempt prepared: every planned partition consumed to its end cut, the
    staged rows equal to the checkpoint's counts, the attempt not fenced by a
    newer one. Fails at once when waiting cannot help.

    :param target: the window's PostgresTarget
    :param attempt: the stage task's attempt (its XCom; templated)
    :param deferrable: wait in the triggerer instead of a worker slot
    """

    template_fields: Sequence[str] = ("attempt",)
    ui_color = "#fff4e0"

    def __init__(
        self,
        *,
        target: PostgresTarget,
        attempt: Any,
        deferrable: bool = False,
        poke_interval: float = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if not isinstance(target, PostgresTarget):
            raise TypeError(f"target must be a PostgresTarget, not {type(target).__name__}")
        self.target = target
        self.attempt = attempt
        self.deferrable = deferrable

    def _kwargs(self) -> dict[str, Any]:
        if not isinstance(self.attempt, dict):
            raise AirflowException(f"attempt must be the stage task's XCom (a dict), got {self.attempt!r}")
        return {"target": _target_kwargs(self.target), "attempt": dict(self.attempt)}

    def poke(self, context) -> PokeReturnValue:
        from airflow_eos.hooks.eos import prepared_or_none

        detail = prepared_or_none(**self._kwargs())
        if detail is None:
            return PokeReturnValue(is_done=False)
        self.log.info("%s", detail)
        return PokeReturnValue(is_done=True, xcom_value=self.attempt)

    def execute(self, context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        from airflow_eos.hooks.eos import prepared_or_none
        from airflow_eos.triggers.eos import CheckpointTrigger

        detail = prepared_or_none(**self._kwargs())
        if detail is not None:
            self.log.info("%s", detail)
            return self.attempt
        self.defer(
            trigger=CheckpointTrigger(poll_interval=self.poke_interval, **self._kwargs()),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        if event.get("status") != "done":
            raise AirflowException(f"checkpoint of {self.attempt} failed: {event.get('error')}: {event.get('message')}")
        self.log.info("%s", event["detail"])
        return self.attempt


def _target_kwargs(target: PostgresTarget) -> dict[str, Any]:
    """The target as plain values for a trigger. A target given by connection id
    serialises no secret: the triggerer resolves the connection itself."""
    return {"url": target.url, "table": target.table, "mode": target.mode, "key": list(target.key),
            "on_committed": target.on_committed, "postgres_conn_id": target.postgres_conn_id,
            "columns": list(target.columns) if target.columns is not None else None}
