"""IcebergSink: windows committed into an Apache Iceberg table, one snapshot
each, by a two-phase commit whose decision is the ledger's.

- **begin** opens an attempt (new epoch: older attempts are fenced) once the
  table exists with the lineage columns.
- **write** (Spark's own Parquet writer, or
  :class:`~airflow_eos.targets.iceberg.writer.IcebergWriter`) puts Parquet
  files into the attempt's folder under the table's location; no snapshot
  names them, so no reader sees them.
- **checkpoint + seal** (the job commit, one ledger transaction): each
  checkpointed chunk's files hold what its task counted and fit the table's
  schema; the manifest (file, size, rows) goes into ``eos.staged_files``.
- **prepare**: every manifest file is there, with its size and rows.
- **commit**: the decision (the ledger's transaction: dead letters, offsets,
  the publication *decided*), then the table's commit of exactly the
  manifest's data files in one snapshot carrying the commit token, or, for a
  replace, one overwrite snapshot taking the window's older files out
  (:mod:`~airflow_eos.targets.iceberg.commit`); finished by whoever comes
  next if it dies (core/publication.py).
- **abort** marks the attempt aborted, then deletes its folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from airflow_eos.core.ledger import Ledger
from airflow_eos.core.publication import PublishedAfterDecision
from airflow_eos.core.sink import Sink
from airflow_eos.targets.iceberg.abort import IcebergAbort
from airflow_eos.targets.iceberg.commit import IcebergCommit
from airflow_eos.targets.iceberg.published import IcebergPublished
from airflow_eos.targets.iceberg.ids import LEDGER_CATALOG, spec_dict, target_id


@dataclass(frozen=True)
class IcebergSink(IcebergCommit, IcebergAbort, IcebergPublished, PublishedAfterDecision, Sink):
    """The runtime sink of a bound :class:`~airflow_eos.targets.iceberg.IcebergTarget`."""

    table_name: str
    ledger_url: str = field(repr=False)
    catalog_name: str = "airflow_eos"
    catalog_json: str = field(default="{}", repr=False)
    catalog_conn_id: str | None = None
    on_committed: str = "skip"
    postgres_conn_id: str = "postgres_default"

    @property
    def ledger(self) -> Ledger:  # type: ignore[override]
        return Ledger(self.ledger_url)

    @property
    def catalog_label(self) -> str:  # type: ignore[override]
        return self.catalog_conn_id or LEDGER_CATALOG

    @property
    def target_id(self) -> str:
        return target_id(self.catalog_label, self.table_name)

    @property
    def target_ids(self) -> list[str]:
        return [self.target_id]

    def claim_identity(self) -> str:
        """The table's UUID: two specs naming one table through different
        catalog connections are one target."""
        return f"iceberg-table:{self.table().metadata.table_uuid}"

    @property
    def replaces_committed(self) -> bool:
        return self.on_committed == "replace"

    def to_dict(self) -> dict:
        return spec_dict(self.table_name, self.postgres_conn_id, self.catalog_conn_id, self.catalog_name,
                         self.on_committed, self.ledger_url, json.loads(self.catalog_json) or None)
