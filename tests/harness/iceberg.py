"""Iceberg tables for the tests: made in the SQL catalog the Iceberg target
keeps in the ledger's database (the ledger migrated first) or, given its
catalog properties, in another catalog (the session's REST catalog), and read
back as a reader reads them (pyiceberg's scan of the current snapshot)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from sqlalchemy.exc import IntegrityError

# The contract suite's rows (harness/sink_contract.py's ContractTarget.batch): the table's columns.
ORDERS = pa.schema([("id", pa.int64()), ("note", pa.string()), ("eos_topic", pa.string()),
                    ("eos_partition", pa.int32()), ("eos_offset", pa.int64())])


def rest_catalog_properties(uri: str) -> dict:
    """pyiceberg's properties of the REST catalog at ``uri`` (no credential: the test server takes none)."""
    return {"type": "rest", "uri": uri}


def catalog(pg_url: str, properties: dict | None = None):
    """The catalog of ``properties``; None: the SQL catalog in the ledger's database."""
    from airflow_eos.targets.iceberg.table import ledger_catalog_properties, load_catalog
    return load_catalog("airflow_eos", properties or ledger_catalog_properties(pg_url))


def create_table(pg_url: str, name: str, warehouse: Path | str, schema: pa.Schema = ORDERS,
                 properties: dict | None = None):
    """The table ``name`` (namespace.table) with ``schema``, located under
    ``warehouse`` (a directory, or a URL such as ``s3://bucket/prefix``), in
    the catalog of ``properties`` (None: the ledger's); the table if it exists
    already."""
    from airflow_eos.core.ledger import Ledger
    Ledger(pg_url).migrate()
    cat = catalog(pg_url, properties)
    namespace, _, table = name.rpartition(".")
    try:
        cat.create_namespace_if_not_exists(namespace)
    except IntegrityError:
        pass  # made by a concurrent case between pyiceberg's check and its insert (chaos cells run in threads)
    if cat.table_exists(name):
        return cat.load_table(name)
    root = warehouse if "://" in str(warehouse) else f"file://{warehouse}"
    return cat.create_table(name, schema, location=f"{root}/{namespace}/{table}")


def rows(pg_url: str, name: str, properties: dict | None = None) -> list[dict]:
    """The table's rows at its current snapshot, as pyiceberg reads them."""
    return catalog(pg_url, properties).load_table(name).scan().to_arrow().to_pylist()
