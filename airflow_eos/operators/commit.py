"""The last steps of a window: publish the prepared attempt (``steps.commit``),
and abort whatever attempt is still live, as the window's teardown (``steps.abort``)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias, BaseOperator
from airflow_eos.core.attempt import Attempt
from airflow_eos.core.target import DEFAULT_CONN_IDS, KAFKA, TargetSpec, as_spec
from airflow_eos.core.windows import Window
from airflow_eos.operators.base import DATA_INTERVAL_END, DATA_INTERVAL_START, TargetHooks

# The hooks and the steps are imported when a task runs: they load the Kafka and
# Postgres providers' clients, which parsing a DAG must not.
if TYPE_CHECKING:
    from airflow_eos.hooks.eos import EosKafkaHook


class EosCommitOperator(TargetHooks, BaseOperator):
    """Publish the prepared attempt and advance the pipeline's offsets
    atomically (``steps.commit``). Idempotent: a retry after success does
    nothing and says so. A window committed before is skipped or replaced, as
    the target's ``on_committed`` says. Returns the commit's summary
    (``steps.Committed``), which is also the extra of the target's Asset event.

    The Asset event (``target.asset_uri``) is emitted through each AssetAlias
    among ``outlets`` (``window.target_alias``), and only when the target changed
    and no commit step had announced it (``Committed.announce``): a retried or
    rerun commit that does nothing emits none. Reports OpenLineage (see
    ``operators/lineage.py``).

    One commit task instance of a DAG runs at a time (``max_active_tis_per_dag=1``
    unless given): Airflow's API server creates an alias's Asset on its first event
    without a guard, so two windows' commits reporting the first event of a new
    target at once collide on the Asset's unique key, and the server marks the
    loser ``failed`` after it published. A commit takes well under a second, so
    a backfill loses little by them waiting for each other.

    :param target: the window's target spec (e.g. PostgresTarget)
    :param attempt: the stage task's attempt (its XCom; templated)
    :param mirror_group_id: if set, also commit the pipeline's offsets to this
        Kafka consumer group after the transaction, for lag tools; the ledger
        stays the source of truth
    :param kafka_conn_id: the connection of the group to mirror to
    """

    template_fields: Sequence[str] = ("attempt",)
    ui_color = "#e6f5e6"

    def __init__(
        self,
        *,
        target: TargetSpec,
        attempt: Any,
        mirror_group_id: str | None = None,
        kafka_conn_id: str = DEFAULT_CONN_IDS[KAFKA],
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_active_tis_per_dag", 1)
        super().__init__(**kwargs)
        self.target = as_spec(target)
        self.attempt = attempt
        self.mirror_group_id = mirror_group_id
        self.kafka_conn_id = kafka_conn_id

    @cached_property
    def kafka_hook(self) -> "EosKafkaHook":
        from airflow_eos.hooks.eos import EosKafkaHook

        return EosKafkaHook(kafka_config_id=self.kafka_conn_id)

    def execute(self, context) -> dict:
        from airflow_eos import steps
        from airflow_eos.hooks.eos import failing_terminally

        mirror = (steps.OffsetMirror(self.kafka_hook.kafka_config, self.mirror_group_id)
                  if self.mirror_group_id else None)
        with failing_terminally():
            summary = steps.commit(self.sink, Attempt.from_dict(self.attempt), mirror=mirror).to_dict()
        self._summary = summary
        if summary["announce"]:  # the target changed and Airflow was not told: one Asset event, via the alias
            for alias in (o for o in self.outlets if isinstance(o, AssetAlias)):
                context["outlet_events"][alias].add(Asset(self.target_hook.bound.asset_uri), extra=summary)
        return summary

    def get_openlineage_facets_on_start(self):
        from airflow_eos.operators.lineage import commit_lineage

        return commit_lineage(self)

    def get_openlineage_facets_on_complete(self, task_instance):
        from airflow_eos.operators.lineage import commit_lineage

        return commit_lineage(self, getattr(self, "_summary", None))


class EosAbortOperator(TargetHooks, BaseOperator):
    """Abort the window's live attempts: mark them aborted and drop their
    staging (``steps.abort``). The window stays planned and can be run again.

    Used as the teardown of the window's task group: it runs whether the window
    failed or not (after a successful commit it finds nothing live, or only a
    zombie attempt, which it aborts), and being a teardown it does not hide a
    failure: the DAG run still ends failed.
    """

    template_fields: Sequence[str] = ("pipeline", "window_start", "window_end")
    ui_color = "#f4e6e6"

    def __init__(
        self,
        *,
        pipeline: str,
        target: TargetSpec,
        window_start: str = DATA_INTERVAL_START,
        window_end: str = DATA_INTERVAL_END,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.target = as_spec(target)
        self.window_start = window_start
        self.window_end = window_end

    def execute(self, context) -> list[int]:
        from airflow_eos import steps

        window = Window(self.pipeline, str(self.window_start), str(self.window_end))
        return steps.abort(self.sink, window, f"aborted by {self.task_id} of run {context['run_id']}")
