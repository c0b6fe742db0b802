"""Triggers: wait in the triggerer, not in a worker slot.

Both waits of a window (for the window to close, for the checkpoint to be
durable) are the same loop: ask the ledger/broker a yes/no/fail question every
``poll_interval`` seconds. The question is a core call, run in a thread because
the core is synchronous; the triggers serialise only plain values and connection
ids, never secrets. The questions live with the hooks (hooks/eos.py): triggers
import only hooks and the core, never the operators or sensors that defer to them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async

from airflow.triggers.base import BaseTrigger, TriggerEvent
from airflow_eos.core.errors import EosError
from airflow_eos.hooks.eos import plan_or_none, prepared_or_none


class _PollingTrigger(BaseTrigger):
    """Calls ``check()`` until it returns a result (event ``done``) or raises an
    EosError (event ``error``); None means "not yet"."""

    def __init__(self, *, poll_interval: float = 30.0, **kwargs: Any):
        super().__init__()
        self.poll_interval = poll_interval
        self.kwargs = kwargs

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"poll_interval": self.poll_interval, **self.kwargs})

    def check(self) -> dict | None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                result = await sync_to_async(self.check)()
            except EosError as exc:
                yield TriggerEvent({"status": "error", "error": type(exc).__name__, "message": str(exc)})
                return
            if result is not None:
                yield TriggerEvent({"status": "done", **result})
                return
            await asyncio.sleep(self.poll_interval)


class WindowClosedTrigger(_PollingTrigger):
    """Fires with the frozen plan once every partition has passed the window's end
    (or idled past the grace)."""

    def check(self) -> dict | None:
        plan = plan_or_none(**self.kwargs)
        return None if plan is None else {"plan": plan.to_dict()}


class CheckpointTrigger(_PollingTrigger):
    """Fires once the attempt's checkpoint is durable and complete (prepared)."""

    def check(self) -> dict | None:
        detail = prepared_or_none(**self.kwargs)
        return None if detail is None else {"detail": detail}
