"""The Kafka target's staging: the shared staging tables in the ledger's
database (:mod:`airflow_eos.staging`: schema ``eos_staging``, one table per
attempt plus its dead-letter table, rows tagged by chunk, filled by the COPY
writer the PostgreSQL target uses too).

Why PostgreSQL and not the file target's staging files: the Kafka target
needs a ``postgres`` connection anyway (the ledger), so the staging needs no
other place that the Spark executors and the commit task must both see (the
file target needs a shared directory); the commit reads the rows back in one
server-side cursor, in source order; prepare counts them chunk by chunk
(``count_chunks``); abort is a DROP TABLE. The table's columns are
the record's: key, value and header columns as ``bytea`` (strings are staged
as their UTF-8 bytes), then the lineage columns. A mixin of
:class:`~airflow_eos.targets.kafka.sink.KafkaSink`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, StagedChunk
from airflow_eos.core.columns import LINEAGE_COLUMNS
from airflow_eos.core.errors import TargetError
from airflow_eos.core.windows import Window
from airflow_eos.staging import tables
from airflow_eos.staging.tables import CHUNK_COLUMN, CHUNK_DEFAULT, STAGING_SCHEMA, staging_ids
from airflow_eos.staging.writer import StagingWriter
from airflow_eos.targets.kafka.client import check_topic
from airflow_eos.targets.kafka.fields import KafkaSinkFields

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

log = logging.getLogger(__name__)

LINEAGE_TYPES = {"eos_topic": "text", "eos_partition": "integer", "eos_offset": "bigint"}


@dataclass(frozen=True)
class KafkaStagingWriter(StagingWriter):
    """The staging's writer, for a record-shaped staging:
    the record columns (key, value, headers) go to ``bytea`` columns, so a
    string is staged as its UTF-8 bytes and any other type as its text."""

    binary: tuple[str, ...] = ()

    def to_json(self) -> str:
        import json
        data = json.loads(super().to_json())
        data["binary"] = list(self.binary)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> "KafkaStagingWriter":
        import json
        data = json.loads(text)
        return cls(data["url"], data["staging"], tuple(data["columns"]), data["target"], tuple(data["binary"]))

    def write(self, batches: Iterable[pa.RecordBatch | pa.Table],
              dead_letters: Iterable[pa.RecordBatch | pa.Table | Mapping] = ()) -> StagedChunk:
        return super().write((self._as_binary(b) for b in batches), dead_letters)

    def _as_binary(self, batch):
        import pyarrow as pa
        import pyarrow.compute as pc
        names = batch.schema.names
        arrays = []
        for name, column in zip(names, batch.columns):
            t = column.type
            if name in self.binary and not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
                if pa.types.is_dictionary(t):
                    column = column.cast(t.value_type)
                    t = t.value_type
                if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                    column = pc.cast(column, pa.string())
                column = column.cast(pa.binary())
            arrays.append(column)
        cls = pa.Table if isinstance(batch, pa.Table) else pa.RecordBatch
        return cls.from_arrays(arrays, names=names)


class KafkaStaging(KafkaSinkFields):
    """begin, writer and counts of :class:`~airflow_eos.targets.kafka.sink.KafkaSink`."""

    def staged_columns(self) -> tuple[str, ...]:
        return tuple(self.record_columns) + LINEAGE_COLUMNS

    @property
    def record_columns(self) -> tuple[str, ...]:
        return ((self.key_column,) if self.key_column else ()) + (self.value_column,) + tuple(self.header_columns)

    def begin(self, window: Window) -> Attempt:
        """Check the target topic exists (a clear error before any Spark
        work), then open an attempt and create its staging table, in one
        ledger transaction."""
        from psycopg import sql
        check_topic(self.kafka_config, self.topic)
        with self.ledger.connect() as conn, conn.transaction():
            attempt = attempts.open_attempt(conn, window)
            rows_table, _ = staging_ids(attempt.staging)
            columns = [sql.SQL("{} bytea").format(sql.Identifier(c)) for c in self.record_columns]
            columns += [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(LINEAGE_TYPES[c])) for c in LINEAGE_COLUMNS]
            columns.append(sql.SQL("{} bigint NOT NULL DEFAULT {}").format(
                sql.Identifier(CHUNK_COLUMN), sql.SQL(CHUNK_DEFAULT)))
            conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(rows_table, sql.SQL(", ").join(columns)))
            # The dead letters are logged: once the window's transaction has
            # committed in Kafka, the rows are published but the dead letters
            # are only here until the ledger records them, and a database crash
            # empties unlogged tables.
            tables.create_dead_letters(conn, attempt.staging, logged=True)
        log.info("%s: staging %s.%s created for topic %s", attempt, STAGING_SCHEMA, attempt.staging, self.topic)
        return attempt

    def writer(self, attempt: Attempt) -> KafkaStagingWriter:
        with self.ledger.connect() as conn:
            exists = self._staging_exists(conn, attempt)
        if not exists:
            raise TargetError(f"staging of {attempt} does not exist: the attempt was aborted or committed")
        return self.staging_writer(attempt, self.staged_columns())

    def staging_writer(self, attempt: Attempt, columns) -> KafkaStagingWriter:
        """The writer of ``columns`` of the attempt's staging, without asking the
        database (the stage job's write tasks know the columns)."""
        return KafkaStagingWriter(self.ledger_url, attempt.staging, tuple(columns), self.label,
                                  tuple(c for c in self.record_columns if c in columns))

    @property
    def label(self) -> str:
        return f"topic {self.topic}"

    def not_null_columns(self, columns) -> list[str]:
        """The value column and the lineage: a record needs a value (a null
        is a tombstone, not what a transform means) and its source."""
        return [c for c in columns if c in (self.value_column, *LINEAGE_COLUMNS)]

    @staticmethod
    def _staging_exists(conn: psycopg.Connection, attempt: Attempt) -> bool:
        return tables.exists(conn, attempt.staging)

    def count_staged(self, attempt: Attempt) -> dict[int, tuple[int, int]] | None:
        with self.ledger.connect() as conn:
            if not self._staging_exists(conn, attempt):
                return None
            return tables.count_chunks(conn, attempt.staging)

    def _drop_staging(self, conn: psycopg.Connection, attempt: Attempt) -> None:
        tables.drop(conn, attempt.staging)
