"""How an Iceberg target is named and travels, shared by the spec and the
sink (the sink never imports the spec: the spec builds it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KIND = "iceberg"
LEDGER_CATALOG = "ledger"  # the catalog's name in target ids when it lives in the ledger's database


def target_id(catalog_label: str, table: str) -> str:
    """``iceberg:<catalog>/<namespace.table>``: the catalog by its connection
    id (``ledger`` for the SQL catalog in the ledger's database)."""
    return f"{KIND}:{catalog_label}/{table}"


def spec_dict(table: str, postgres_conn_id: str, catalog_conn_id: str | None, catalog_name: str, on_committed: str,
              ledger_url: str | None, catalog_properties: Mapping[str, Any] | None) -> dict[str, Any]:
    """The spec as ``TargetSpec.to_dict`` gives it."""
    return {"kind": KIND, "table": table, "postgres_conn_id": postgres_conn_id, "catalog_conn_id": catalog_conn_id,
            "catalog_name": catalog_name, "on_committed": on_committed, "ledger_url": ledger_url,
            "catalog_properties": dict(catalog_properties) if catalog_properties is not None else None}
