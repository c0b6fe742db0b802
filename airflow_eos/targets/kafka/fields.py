"""The fields of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`, declared
once for its parts (staging, commit, abort, published, intents), each of
which is a mixin of that frozen dataclass and reads them: the dataclass sets
them, this base says what they are."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KafkaSinkFields:
    """What every part of a KafkaSink may read (set by the dataclass)."""

    topic: str  # the target topic
    kafka_config: Mapping[str, Any]  # the librdkafka configuration of the target's cluster
    ledger_url: str  # the ledger's database, which also holds the staging (schema eos_staging)
    key_column: str | None  # the staged column that becomes a record's key (None: no key)
    value_column: str  # the staged column that becomes a record's value
    header_columns: tuple[str, ...]  # staged columns that become headers
    target_id: str  # the target's identity (TargetIdentity.target_id); seeds transactional ids
    transactional_id_prefix: str
    producer_config: Mapping[str, Any]  # extra librdkafka settings of the transactional producer
    on_committed: str  # always "skip": a topic is append-only
