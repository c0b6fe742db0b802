"""IcebergTarget: the spec a DAG names (plain values, cheap to import).

``IcebergTarget(table="analytics.orders", postgres_conn_id=...)`` keeps the
table in a SQL catalog inside the ledger's PostgreSQL database (pyiceberg's
``SqlCatalog``, its tables ``iceberg_tables`` and
``iceberg_namespace_properties`` in the schema ``eos_iceberg``);
``catalog_conn_id=`` names an Airflow connection whose extras are pyiceberg
catalog properties (a REST catalog: Polaris, Nessie, Lakekeeper, Gravitino;
see docs/connections.md). The table must exist (its schema is the contract
the transform's output is checked against, see docs/iceberg-target.md).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eos.core.database import redact
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.migrations import TargetMigration
from airflow_eos.core.target import CONNECTION, DEFAULT_CONN_IDS, POSTGRES, ConnectionRef, TargetSpec, uri_part
from airflow_eos.targets.iceberg.ids import KIND, LEDGER_CATALOG, spec_dict, target_id

if TYPE_CHECKING:
    from airflow_eos.targets.iceberg.sink import IcebergSink

ON_COMMITTED = ("skip", "replace")
_CONN_ID = re.compile(r"^[\w.\-]+$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")


@dataclass(frozen=True)
class IcebergTarget(TargetSpec):
    """An Apache Iceberg table as a two-phase-commit target (see
    :mod:`airflow_eos.targets.iceberg.sink`).

    - ``table``: ``namespace.table`` (a nested namespace: ``a.b.table``).
    - ``postgres_conn_id``: the PostgreSQL database of the ledger (schema
      ``eos``) and, without ``catalog_conn_id``, of the SQL catalog.
    - ``catalog_conn_id``: a connection whose extras are the catalog's
      pyiceberg properties (``{"type": "rest", "uri": ..., "warehouse": ...}``),
      its password the catalog's credential; None: the SQL catalog in the ledger.
    - ``catalog_name``: the catalog's name (pyiceberg's ``load_catalog``).
    - ``on_committed``: committing a window committed already: ``skip`` or
      ``replace`` (the window's files swapped in one overwrite snapshot).
    - ``ledger_url``, ``catalog_properties``: the resolved values, outside
      Airflow (tests, scripts); a DAG names connections instead.
    """

    table: str = ""
    postgres_conn_id: str = DEFAULT_CONN_IDS[POSTGRES]
    catalog_conn_id: str | None = None
    catalog_name: str = "airflow_eos"
    on_committed: str = "skip"
    ledger_url: str | None = None
    catalog_properties: Mapping[str, Any] | None = field(default=None, hash=False)

    kind: ClassVar[str] = KIND
    id_scheme: ClassVar[str] = KIND

    def __post_init__(self) -> None:
        if not isinstance(self.table, str) or not _IDENTIFIER.match(self.table):
            raise ConfigurationError(f"IcebergTarget needs table='namespace.table' (letters, digits, underscores; a "
                                     f"nested namespace as a.b.table), not {self.table!r}")
        if self.on_committed not in ON_COMMITTED:
            raise ConfigurationError(f"on_committed must be one of {ON_COMMITTED}, not {self.on_committed!r}")
        for name, conn_id in (("postgres_conn_id", self.postgres_conn_id), ("catalog_conn_id", self.catalog_conn_id)):
            if conn_id is not None and (not isinstance(conn_id, str) or not _CONN_ID.match(conn_id)):
                raise ConfigurationError(f"{name} must name an Airflow connection, not {conn_id!r}")
        if self.catalog_properties is not None:
            object.__setattr__(self, "catalog_properties", dict(self.catalog_properties))

    def __repr__(self) -> str:
        where = redact(self.ledger_url) if self.ledger_url else f"connection {self.postgres_conn_id!r}"
        return (f"IcebergTarget({self.table!r}, catalog {self.catalog_label!r}, on_committed={self.on_committed!r}, "
                f"ledger in {where})")

    @property
    def catalog_label(self) -> str:
        return self.catalog_conn_id or LEDGER_CATALOG

    # ------------------------------------------------------------------ the spec (core/target.py)

    def to_dict(self) -> dict[str, Any]:
        return spec_dict(self.table, self.postgres_conn_id, self.catalog_conn_id, self.catalog_name,
                         self.on_committed, self.ledger_url, self.catalog_properties)

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "IcebergTarget":
        return cls(**dict(fields))

    @classmethod
    def from_target_name(cls, name: str) -> "IcebergTarget":
        """``<catalog>/<table>`` as :attr:`target_id` writes it."""
        catalog, _, table = name.rpartition("/")
        return cls(table=table, catalog_conn_id=None if catalog in ("", LEDGER_CATALOG) else catalog)

    def connections(self) -> tuple[ConnectionRef, ...]:
        refs = [] if self.ledger_url else [ConnectionRef("ledger", POSTGRES, self.postgres_conn_id)]
        if self.catalog_conn_id and self.catalog_properties is None:
            refs.append(ConnectionRef("catalog", CONNECTION, self.catalog_conn_id))
        return tuple(refs)

    def bind(self, values: Mapping[str, Any]) -> "IcebergTarget":
        changes: dict[str, Any] = {}
        if not self.ledger_url:
            changes["ledger_url"] = values["ledger"]
        if self.catalog_conn_id and self.catalog_properties is None:
            from airflow_eos.targets.iceberg.table import catalog_properties_of
            changes["catalog_properties"] = catalog_properties_of(values["catalog"])
        return dataclasses.replace(self, **changes) if changes else self

    def sink(self) -> "IcebergSink":
        if not self.bound:
            raise ConfigurationError(f"{self!r} is not bound: resolve its connections (bind) before building its sink")
        from airflow_eos.targets.iceberg.sink import IcebergSink
        return IcebergSink(table_name=self.table, ledger_url=self.ledger_url or "",
                           catalog_name=self.catalog_name, catalog_json=_json(self.catalog_properties),
                           catalog_conn_id=self.catalog_conn_id, on_committed=self.on_committed,
                           postgres_conn_id=self.postgres_conn_id)

    @property
    def ledger_conn_id(self) -> str:
        return self.postgres_conn_id

    @property
    def target_id(self) -> str:
        return target_id(self.catalog_label, self.table)

    @property
    def asset_uri(self) -> str:
        """``iceberg://<catalog>/<namespace>/<table>``."""
        return f"iceberg://{uri_part(self.catalog_label)}/" + "/".join(uri_part(p) for p in self.table.split("."))

    @property
    def label(self) -> str:
        return f"Iceberg table {self.table} ({self.catalog_label} catalog)"

    def check_for_dag(self) -> None:
        if self.ledger_url or self.catalog_properties is not None:
            raise ConfigurationError("in a DAG, name the ledger's database with postgres_conn_id and a catalog with "
                                     "catalog_conn_id, not ledger_url / catalog_properties: they would put secrets "
                                     "into the DAG and the task logs")

    @classmethod
    def ledger_migrations(cls) -> Sequence[TargetMigration]:
        """The SQL catalog's tables in the ledger's database (migrations.py)."""
        from airflow_eos.targets.iceberg.migrations import MIGRATIONS
        return MIGRATIONS


def _json(properties: Mapping[str, Any] | None) -> str:
    import json
    return json.dumps(dict(properties or {}), sort_keys=True)
