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
    TargetMigration(
        2,
        """
        -- A window's commit intent: the table's current snapshot when its
        -- publication first began (null: the table had none), written on a
        -- connection of its own before the table's commit. Whether a commit
        -- that died reached the table is read from the table: its token in the
        -- current snapshot's ancestry back to this snapshot; if this snapshot
        -- expired since, the window's files in the current snapshot
        -- (targets/iceberg/table.py). No foreign key: written while the
        -- publication holds the window's rows.
        CREATE TABLE eos.iceberg_intents (
            pipeline       text        NOT NULL,
            window_start   timestamptz NOT NULL,
            epoch          integer     NOT NULL,
            target         text        NOT NULL,
            token          text        NOT NULL,
            base_snapshot  bigint,
            created_at     timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (pipeline, window_start, epoch)
        );
        """,
    ),
)
