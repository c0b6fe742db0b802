"""The first step of a window: resolve and freeze its cuts, push the plan (``steps.plan``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow_eos.core.plan import DEFAULT_MAX_TIMESTAMP_SKEW, ON_SKEWED_FAIL, check_skew_rule
from airflow_eos.core.target import DEFAULT_CONN_IDS, KAFKA, POSTGRES, TargetSpec, as_spec
from airflow_eos.core.windows import WindowPlan
from airflow_eos.operators.base import DATA_INTERVAL_END, DATA_INTERVAL_START


class EosPlanWindowOperator(BaseSensorOperator):
    """Resolve and freeze the window's cuts; push the plan to XCom.

    Waits while the window is not closed (a partition has not passed the window's
    end): by deferring to a trigger (``deferrable=True``, no worker slot held),
    or by poking/rescheduling like any sensor. Re-running returns the frozen plan.

    :param pipeline: stable id of the pipeline; owns its cuts, windows and offsets
    :param topics: source topics
    :param window_start: start of the window (templated; default the data interval start)
    :param window_end: end of the window (templated; default the data interval end)
    :param idle_partition_grace: how long after the window's end a partition with
        no newer record may stay silent before its cut is frozen at its end of log
    :param max_timestamp_skew: how far beyond a window boundary a record may be
        stamped before it counts as skewed when older records follow it (a cut
        there would hold the partition window after window)
    :param on_skewed_timestamp: ``"fail"`` (default): planning fails naming the
        skewed record, nothing is frozen; ``"position"``: the record does not
        close the window, it is published in the window of its offset (logged
        as a warning, the cut's ``how`` is ``skewed``)
    :param deferrable: wait in the triggerer (default: Airflow's ``[operators] default_deferrable``)
    :param target: the window's target spec (e.g. PostgresTarget). The plan
        claims the pipeline for this DAG, its topics and this target in the
        ledger (the first plan claims; a plan from another DAG, for other topics
        or into another target fails without retries, naming both). Without it
        the claim names no target until a plan that has one. The ledger is in
        the target's ledger database: ``postgres_conn_id`` defaults to it.
    :param schema_registry_conn_id: an Avro source's ``eos_schema_registry``
        connection (None: raw values); the plan freezes ``reader_schema`` (Avro
        JSON) or, None, the latest schema of the topics' ``<topic>-value``
        subjects there (which must agree)
    :param reader_schema: an Avro source's reader schema (see above)
    """

    template_fields: Sequence[str] = ("pipeline", "topics", "window_start", "window_end")
    ui_color = "#e8f4ff"

    def __init__(
        self,
        *,
        pipeline: str,
        topics: Sequence[str],
        kafka_conn_id: str = DEFAULT_CONN_IDS[KAFKA],
        postgres_conn_id: str | None = None,
        window_start: str = DATA_INTERVAL_START,
        window_end: str = DATA_INTERVAL_END,
        idle_partition_grace: timedelta = timedelta(minutes=5),
        max_timestamp_skew: timedelta = DEFAULT_MAX_TIMESTAMP_SKEW,
        on_skewed_timestamp: str = ON_SKEWED_FAIL,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = 60,
        target: TargetSpec | None = None,
        schema_registry_conn_id: str | None = None,
        reader_schema: str | None = None,
        **kwargs: Any,
    ) -> None:
        # Before the base class adds the task to the DAG: a refused task leaves no trace there.
        check_skew_rule(max_timestamp_skew, on_skewed_timestamp, f"task {kwargs.get('task_id')!r}")
        if target is not None:
            target = as_spec(target)
        super().__init__(poke_interval=poke_interval, **kwargs)
        if isinstance(topics, str):
            raise ValueError(f"topics must be a list of topic names, not the string {topics!r}")
        if not topics:
            raise ValueError("topics must not be empty")
        if target is not None and postgres_conn_id not in (None, target.ledger_conn_id):
            raise ValueError(f"postgres_conn_id {postgres_conn_id!r} is not the ledger connection of the target "
                             f"{target.label} ({target.ledger_conn_id!r}): the ledger lives in the target's database; "
                             "leave postgres_conn_id out")
        self.pipeline = pipeline
        self.topics = list(topics)
        self.kafka_conn_id = kafka_conn_id
        self.target = target
        self.postgres_conn_id = postgres_conn_id or (target.ledger_conn_id if target else DEFAULT_CONN_IDS[POSTGRES])
        self.window_start = window_start
        self.window_end = window_end
        self.idle_partition_grace = idle_partition_grace
        self.max_timestamp_skew = max_timestamp_skew
        self.on_skewed_timestamp = on_skewed_timestamp
        self.deferrable = deferrable
        self.schema_registry_conn_id = schema_registry_conn_id
        self.reader_schema = reader_schema

    @cached_property
    def _plan_kwargs(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "topics": list(self.topics),
            "window_start": str(self.window_start),
            "window_end": str(self.window_end),
            "idle_partition_grace_seconds": self.idle_partition_grace.total_seconds(),
            "kafka_conn_id": self.kafka_conn_id,
            "postgres_conn_id": self.postgres_conn_id,
            "max_timestamp_skew_seconds": self.max_timestamp_skew.total_seconds(),
            "on_skewed_timestamp": self.on_skewed_timestamp,
            # the plan's claim on the pipeline (plain values: the trigger serialises them)
            "dag_id": self.dag_id if self.has_dag() else None,
            "target_id": self.target.target_id if self.target else None,
            "target_aliases": list(self.target.target_aliases) if self.target else [],
            "target_exclusive": self.target.exclusive if self.target else False,
            # resolved at run time into the target's physical place (Sink.claim_identity)
            "target": self.target.to_dict() if self.target else None,
            # an Avro source: the reader schema frozen with the plan (None: the subjects' latest at freezing)
            "schema_registry_conn_id": self.schema_registry_conn_id,
            "reader_schema": self.reader_schema,
        }

    def _plan_or_none(self) -> WindowPlan | None:
        from airflow_eos.hooks.eos import failing_terminally, plan_or_none

        with failing_terminally():  # the same plan fails the same way on every retry
            return plan_or_none(**self._plan_kwargs)

    def poke(self, context) -> PokeReturnValue:
        plan = self._plan_or_none()
        if plan is None:
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=plan.to_dict())

    def execute(self, context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        plan = self._plan_or_none()
        if plan is not None:
            return plan.to_dict()
        from airflow_eos.triggers.eos import WindowClosedTrigger

        self.defer(
            trigger=WindowClosedTrigger(poll_interval=self.poke_interval, **self._plan_kwargs),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context, event: dict[str, Any]) -> dict:
        from airflow_eos.hooks.eos import reraise_event_error

        if event.get("status") != "done":
            reraise_event_error(event, f"planning window {self.window_start} .. {self.window_end} of {self.pipeline}")
        plan = WindowPlan.from_dict(event["plan"])
        self.log.info("window %s planned (in the triggerer): %d partition range(s), at most %d records",
                      plan.window, len(plan.ranges), plan.max_records)
        for r in plan.ranges:
            self.log.info("  %s [%d, %d)", r.tp, r.start_offset, r.end_offset)
        return plan.to_dict()
