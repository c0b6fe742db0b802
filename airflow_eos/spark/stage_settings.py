"""What the stage job hands its Spark tasks, and what its read tasks hand back.

- StageSettings: everything the staging writer's tasks and its job commit need
  (the target, the attempt, the plan, the job run, the writer's Layout, the
  limits, the source's Kafka settings), as the options of the ``eos_staging``
  data source: writer tasks and the job commit run in Python workers, which get
  nothing else from the driver.
- report_read, the eos_kafka source's report hook (REPORT_HOOK, resolved by
  name inside Spark's workers): each read task that read its sub-range to the end
  cut records it in the ledger (core.attempt.record_read_range); the job commit
  loads those reports (load_read_ranges) as what the attempt consumed. With
  Spark's own Kafka source the driver records them after the job from the
  metrics observed on the read (record_observed_reads), then writes the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, ConsumedRange
from airflow_eos.core.database import connect
from airflow_eos.core.errors import ConfigurationError, InvalidCheckpoint
from airflow_eos.core.sink import Sink
from airflow_eos.core.windows import WindowPlan
from airflow_eos.spark.kafka_source import KAFKA_PREFIX, option_string
from airflow_eos.spark.layout import Layout
from airflow_eos.spark.submit import TARGET_ENV, target_from_environment, target_json  # the one format of a target

if TYPE_CHECKING:
    from airflow_eos.spark.kafka_ranges import KafkaRangePartition, ReadStats

FORMAT_NAME = "eos_staging"  # the staging data source's name (spark.staging_source)
REPORT_HOOK = f"{__name__}:report_read"

# A chunk is one transaction; bounding it bounds what a write task holds in
# memory to isolate a refused row, and what a failure re-does.
DEFAULT_ROWS_PER_CHUNK = 1_000_000
DEFAULT_CHUNK_BYTES = 256 << 20


@dataclass(frozen=True)
class StageSettings:
    """Everything the writer's tasks and its commit need; travels as options."""

    # A sink staged through the eos_staging writer (a PostgresSink, a
    # KafkaSink): it has staging_writer(attempt, columns) and a spec's to_dict().
    target: Sink
    attempt: Attempt
    plan: WindowPlan
    run: str
    layout: Layout
    max_bad_records: int
    rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # The source's Kafka settings: write tasks read the records of dead letters
    # that lack their key and value back by lineage (TaskStager._read_back_raw).
    # run_stage always sets them; empty only where a test stages without Kafka.
    kafka_config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # The driver writes the checkpoint after the job (Spark's own Kafka source: what was read
    # is known from observed metrics only then); the job commit only records its chunks.
    checkpoint_by_driver: bool = False

    def to_options(self) -> dict[str, str]:
        # One option per Kafka setting, as the eos_kafka source has them, so that
        # Spark's redaction hides e.g. kafka.sasl.password.
        kafka = {KAFKA_PREFIX + k: option_string(v) for k, v in self.kafka_config.items()}
        return {**kafka,
            # "secret" in the key: Spark redacts options whose key matches
            # spark.redaction.regex, and the target's URL may hold a password.
            "target.secret": target_json(self.target),
            "attempt": json.dumps(self.attempt.to_dict()),
            "plan": self.plan.to_json(),
            "run": self.run,
            "layout": self.layout.to_json(),
            "max_bad_records": str(self.max_bad_records),
            "rows_per_chunk": str(self.rows_per_chunk),
            "chunk_bytes": str(self.chunk_bytes),
            "checkpoint": "driver" if self.checkpoint_by_driver else "job_commit",
        }

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "StageSettings":
        try:
            return cls(
                target=target_from_environment({TARGET_ENV: options["target.secret"]}),
                attempt=Attempt.from_dict(json.loads(options["attempt"])),
                plan=WindowPlan.from_json(options["plan"]),
                run=options["run"],
                layout=Layout.from_json(options["layout"]),
                max_bad_records=int(options["max_bad_records"]),
                rows_per_chunk=int(options["rows_per_chunk"]),
                chunk_bytes=int(options["chunk_bytes"]),
                kafka_config={k[len(KAFKA_PREFIX):]: v for k, v in options.items() if k.startswith(KAFKA_PREFIX)},
                checkpoint_by_driver=options.get("checkpoint") == "driver",
            )
        except KeyError as exc:
            raise ConfigurationError(f"the {FORMAT_NAME} data source needs option {exc}; use run_stage") from None



# --------------------------------------------------------------------------- read side: what was consumed


def report_options(settings_url: str, attempt: Attempt, run: str) -> dict[str, str]:
    """The ``report.*`` options of the eos_kafka source for :func:`report_read`."""
    # "secret" in the key, for Spark's redaction of options (see StageSettings).
    return {"ledger.secret": settings_url, "attempt": json.dumps(attempt.to_dict()), "run": run}


def report_read(options: Mapping[str, str], task: "KafkaRangePartition", stats: "ReadStats") -> None:
    """The eos_kafka source's hook: record that ``task``'s sub-range was read
    completely, holding ``stats.records`` records. Idempotent: a retried or
    speculative read of the same sub-range must find the same count."""
    attempt = Attempt.from_dict(json.loads(options["attempt"]))
    read = ConsumedRange(task.topic, task.partition, task.start_offset, task.end_offset, stats.records)
    with connect(options["ledger.secret"], f"read report {attempt}") as conn:
        first = attempts.record_read_range(conn, attempt, options["run"], read, stats.total_s)
    if (first.end_offset, first.records) != (task.end_offset, stats.records):
        raise InvalidCheckpoint(
            f"{task}: read {stats.records} records up to offset {task.end_offset}, but an earlier read of the "
            f"same range in this job found {first.records} up to {first.end_offset}: the log changed under a "
            "frozen plan")


def record_observed_reads(url: str, attempt: Attempt, run: str, read) -> None:
    """Spark's own Kafka source: record, on the driver after the job, what the
    job read of each planned range as observed on the source DataFrame
    (kafka_native.observed_reads), as the eos_kafka source's read tasks do
    themselves (``read``: a kafka_native.ObservedRead); read_coverage then
    checks both alike. Each sub-range is one report, its read seconds unknown (0)."""
    from airflow_eos.spark.kafka_native import observed_reads

    reads = observed_reads(read)
    with connect(url, f"read report {attempt}") as conn:
        for r in reads:
            first = attempts.record_read_range(conn, attempt, run, r, 0.0)
            if first != r:
                raise InvalidCheckpoint(f"{r.tp}: read {r.records} records up to offset {r.end_offset}, but an "
                                        f"earlier report of this job run says {first.records} up to {first.end_offset}")


def load_read_ranges(url: str, attempt: Attempt, run: str) -> list[tuple[ConsumedRange, float]]:
    """The sub-ranges the run's read tasks reported, with their read seconds."""
    with connect(url, f"load read ranges {attempt}") as conn:
        return attempts.load_read_ranges(conn, attempt, run)


def read_coverage(url: str, attempt: Attempt, run: str, plan: WindowPlan) -> list[tuple[ConsumedRange, float]]:
    """The sub-ranges the run's read tasks reported (load_read_ranges), once
    they cover the plan exactly: InvalidCheckpoint (no checkpoint) if the job
    did not read its plan completely."""
    reported = load_read_ranges(url, attempt, run)
    merged = attempts.make_checkpoint([r for r, _ in reported], [])
    problems = attempts.coverage_problems(plan.ranges, merged.ranges)
    if problems:
        raise InvalidCheckpoint(f"{attempt}: the job did not read its plan completely, no checkpoint written:\n  "
                                + "\n  ".join(problems))
    return reported


__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_ROWS_PER_CHUNK", "FORMAT_NAME", "REPORT_HOOK", "StageSettings",
           "load_read_ranges", "read_coverage", "record_observed_reads", "report_options", "report_read"]
