"""The Iceberg target's own tables in the ledger's database, on its own track
of versions (core/migrations.py's ``TargetMigration``), applied by
``Ledger.migrate`` under the core's migration lock.

pyiceberg's SQL catalog (``SqlCatalog``, schema version v1) in the schema
``eos_iceberg``: made here, once, rather than by every process that opens
the catalog (``init_catalog_tables``), whose concurrent ``CREATE TABLE`` s
would race. The columns are pyiceberg's (and the Iceberg JDBC catalog's).
"""

from __future__ import annotations

from airflow_eos.core.migrations import TargetMigration

MIGRATIONS: tuple[TargetMigration, ...] = (
    TargetMigration(
        1,
        """
        CREATE SCHEMA IF NOT EXISTS eos_iceberg;
        CREATE TABLE IF NOT EXISTS eos_iceberg.iceberg_tables (
            catalog_name                varchar(255)  NOT NULL,
            table_namespace             varchar(255)  NOT NULL,
            table_name                  varchar(255)  NOT NULL,
            metadata_location           varchar(1000),
            previous_metadata_location  varchar(1000),
            iceberg_type                varchar(5),
            PRIMARY KEY (catalog_name, table_namespace, table_name)
        );
        CREATE TABLE IF NOT EXISTS eos_iceberg.iceberg_namespace_properties (
            catalog_name    varchar(255)  NOT NULL,
            namespace       varchar(255)  NOT NULL,
            property_key    varchar(255)  NOT NULL,
            property_value  varchar(1000) NOT NULL,
            PRIMARY KEY (catalog_name, namespace, property_key)
        );
        """,
    ),
)
