"""OpenLineage of a window's stage and commit (apache-airflow-providers-openlineage).

The OpenLineage listener asks an operator for ``get_openlineage_facets_on_start``
and ``..._on_complete``; the stage and the commit answer with :func:`window_lineage`:

- inputs: the window's Kafka topics, with ``inputStatistics`` (rowCount: the
  records of the window read from that topic) once the stage job reported them;
- outputs: the target, with ``outputStatistics`` (rowCount: the rows this
  commit published; 0 for a no-op) on the commit's completion;
- the run facet ``eosWindow``: pipeline, window, epoch and, for the commit,
  its outcome and counts.

Each dataset is named as the providers of its scheme name it: its Airflow asset
URI (``kafka://broker/topic``, ``postgres://host:port/db/schema/table``,
``file:///root``) converted by the converter that provider registers, so a table
this package publishes into is the same dataset an SQL operator reads.

Imported by those methods only: DAG parsing never loads OpenLineage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from airflow.providers.openlineage.utils.utils import translate_airflow_asset
from airflow.sdk import Asset
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    RunFacet,
    input_statistics_input_dataset,
    output_statistics_output_dataset,
)

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.sink import PUBLISHED, REPLACED, CommitOutcome
from airflow_eos.core.target import TargetSpec, kafka_asset_uri

WINDOW_FACET = "eosWindow"
_COMMIT_FIELDS = ("outcome", "committed_epoch", "published_rows", "dead_letter_rows", "replaced_rows", "announce")


@attr.define
class EosWindowRunFacet(RunFacet):
    """The exactly-once window this run staged or committed (custom run facet ``eosWindow``)."""

    pipeline: str
    windowStart: str  # noqa: N815 - OpenLineage facets are camelCase
    windowEnd: str  # noqa: N815
    epoch: int | None = None
    outcome: str | None = None  # the commit's: published | replaced | already_committed | skipped
    committedEpoch: int | None = None  # noqa: N815
    publishedRows: int | None = None  # noqa: N815
    deadLetterRows: int | None = None  # noqa: N815
    replacedRows: int | None = None  # noqa: N815
    announce: bool | None = None  # the commit emitted the target's Asset event

    @staticmethod
    def _get_schema() -> str:
        return "https://github.com/airflow-eos/airflow-eos/blob/main/README.md#lineage-openlineage"


def dataset(uri: str) -> tuple[str, str]:
    """(namespace, name) of an asset URI, by the converter its scheme's provider
    registers; the name decoded from the URI's percent-encoding (``uri_part``),
    so a root ``/data/a b`` or a table ``t ü`` is named as its owner names it."""
    converted = translate_airflow_asset(Asset(uri), None)
    if converted is None:
        raise ConfigurationError(f"no OpenLineage converter for the asset {uri!r}: is the provider of its scheme "
                                 "installed?")
    return converted.namespace, unquote(converted.name)


def window_facet(window: Mapping[str, Any], commit: Mapping[str, Any] | None = None) -> EosWindowRunFacet:
    """The ``eosWindow`` facet of an attempt's (or a stage's) dict, with the commit's summary if there is one."""
    counts = {_camel(k): (commit or {}).get(k) for k in _COMMIT_FIELDS}
    return EosWindowRunFacet(pipeline=window["pipeline"], windowStart=window["window_start"],
                             windowEnd=window["window_end"], epoch=window.get("epoch"), **counts)


def records_per_topic(report: Mapping[str, Any] | None) -> dict[str, int]:
    """The records the stage job read, per topic (from its report's consumed ranges)."""
    rows: dict[str, int] = {}
    for consumed in (report or {}).get("consumed") or ():
        rows[consumed["topic"]] = rows.get(consumed["topic"], 0) + int(consumed["records"])
    return rows


def window_lineage(*, kafka_config: Mapping[str, Any], topics: Iterable[str], target: TargetSpec,
                   facet: EosWindowRunFacet, topic_rows: Mapping[str, int] | None = None,
                   output_rows: int | None = None) -> OperatorLineage:
    """The lineage of one window's task: the topics in, the (bound) target out."""
    inputs = []
    for topic in topics:
        namespace, name = dataset(kafka_asset_uri(kafka_config, topic))
        stats = ({"inputStatistics": input_statistics_input_dataset.InputStatisticsInputDatasetFacet(
            rowCount=topic_rows[topic])} if topic_rows and topic in topic_rows else {})
        inputs.append(InputDataset(namespace=namespace, name=name, inputFacets=stats))
    namespace, name = dataset(target.asset_uri)
    stats = ({} if output_rows is None else {"outputStatistics": (
        output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(rowCount=output_rows))})
    return OperatorLineage(inputs=inputs, outputs=[OutputDataset(namespace=namespace, name=name, outputFacets=stats)],
                           run_facets={WINDOW_FACET: facet})


def rows_written(commit: Mapping[str, Any]) -> int:
    """The rows a commit wrote into the target: the window's rows if it published or replaced them, else 0."""
    return int(commit["published_rows"]) if CommitOutcome(commit["outcome"]) in (PUBLISHED, REPLACED) else 0


def stage_lineage(stage: Any, staged: Mapping[str, Any] | None = None) -> OperatorLineage:
    """EosSparkStageOperator's: its source's topics into its target; once it ran
    (``staged``: its XCom), the attempt's epoch and the records read per topic."""
    if staged is None:
        window = stage.window_plan.window
        staged = {"pipeline": window.pipeline, "window_start": window.start.isoformat(),
                  "window_end": window.end.isoformat()}
    return window_lineage(kafka_config=stage.kafka_config, topics=stage.source.topics,
                          target=stage.target_hook.bound, facet=window_facet(staged),
                          topic_rows=records_per_topic(staged.get("report")))


def commit_lineage(commit: Any, summary: Mapping[str, Any] | None = None) -> OperatorLineage:
    """EosCommitOperator's: the topics the staged attempt read into the target, with the rows
    this commit published once it ran."""
    topic_rows = records_per_topic(commit.attempt.get("report"))
    return window_lineage(kafka_config=commit.kafka_hook.kafka_config, topics=sorted(topic_rows),
                          target=commit.target_hook.bound, facet=window_facet(commit.attempt, summary),
                          topic_rows=topic_rows, output_rows=None if summary is None else rows_written(summary))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
