"""KafkaSink: each window published into a Kafka topic in one producer
transaction, fenced per window, idempotent, with the ledger in PostgreSQL.

In the order of a window's life:

- **begin** checks the topic exists, opens an attempt (new epoch: older ones
  fenced) and creates its staging table (the PostgreSQL target's staging, in
  the ledger's database: see :mod:`~airflow_eos.targets.kafka.staging`).
- **write** (Spark tasks, or :class:`~airflow_eos.targets.kafka.staging.KafkaStagingWriter`)
  COPYs the record columns (key, value, headers) and the lineage into it, one
  chunk per task.
- **checkpoint / prepare**: the core's, counting the staging chunk by chunk.
- **commit** (:mod:`~airflow_eos.targets.kafka.commit`): the whole Kafka
  transaction in the commit task (``transactional.id`` per window; its
  ``init_transactions`` fences every other committer of the window), the
  window's marker in the same transaction, then the ledger.
- **abort** finishes the window first when a commit may have reached Kafka,
  then marks the attempt aborted and drops its staging.
- **verify** reads the topic back (:mod:`~airflow_eos.targets.kafka.published`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.sink import Sink
from airflow_eos.targets.kafka import client
from airflow_eos.targets.kafka.abort import KafkaAbort
from airflow_eos.targets.kafka.commit import KafkaCommit
from airflow_eos.targets.kafka.published import KafkaPublished
from airflow_eos.targets.kafka.staging import KafkaStaging

__all__ = ["KafkaSink"]


@dataclass(frozen=True)
class KafkaSink(KafkaStaging, KafkaCommit, KafkaAbort, KafkaPublished, Sink):
    """The runtime sink of a bound :class:`~airflow_eos.targets.kafka.KafkaTarget`."""

    topic: str
    kafka_config: Mapping[str, Any] = field(repr=False)
    ledger_url: str = field(repr=False)
    key_column: str | None = "key"
    value_column: str = "value"
    header_columns: tuple[str, ...] = ()
    target_id: str = ""  # type: ignore[assignment]
    transactional_id_prefix: str = "airflow-eos"
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    on_committed: str = "skip"
    # The bound KafkaTarget that built this sink (not imported here: spec.py
    # imports this module): the stage job ships it to its Spark tasks
    # (to_dict), which build the sink again from it.
    spec: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        if self.spec is None:
            raise ConfigurationError(f"{self!r} was not built by KafkaTarget.sink(): it has no spec to ship to the "
                                     "stage job's tasks")
        return self.spec.to_dict()

    @property
    def ledger(self) -> Ledger:  # type: ignore[override]
        return Ledger(self.ledger_url)

    def claim_identity(self) -> str:
        """The topic on its cluster (``kafka-cluster:<cluster id>/<topic>``), not
        the connection id of ``target_id``: two connections to one cluster name
        one target. ``target_id`` stays the seed of the transactional ids and
        marker groups, so that windows in flight keep their fencing."""
        return client.cluster_identity(self.kafka_config, self.topic)
