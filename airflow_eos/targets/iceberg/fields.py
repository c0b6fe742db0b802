"""The fields of :class:`~airflow_eos.targets.iceberg.sink.IcebergSink` and
what every part of it reads through them (the catalog, the table, the store of
its files, where an attempt's files are), declared once for its parts
(staging, commit, abort, published), each a mixin of that frozen dataclass."""

from __future__ import annotations

import json
from functools import cached_property
from typing import TYPE_CHECKING

from airflow_eos.core.attempt import Attempt
from airflow_eos.targets.iceberg import table as tables
from airflow_eos.targets.iceberg.files import Store, io_properties

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

EOS_DIR = "data/eos"  # under the table's location: one folder per attempt, named by its staging


class IcebergSinkFields:
    """What every part of an IcebergSink may read (set by the dataclass)."""

    table_name: str  # namespace.table
    ledger_url: str
    catalog_name: str
    # the catalog's pyiceberg properties, JSON ("{}": the SQL catalog in the ledger; type "sql" without a "uri":
    # the SQL catalog in the ledger with these properties, e.g. an object store's s3.*)
    catalog_json: str
    catalog_label: str  # the catalog as target ids name it (its connection id, or "ledger")
    on_committed: str  # "skip" or "replace"

    @property
    def catalog_properties(self) -> dict[str, str]:
        given = json.loads(self.catalog_json)
        if not given or (given.get("type") == "sql" and "uri" not in given):
            return {**tables.ledger_catalog_properties(self.ledger_url), **given}
        return given

    def catalog(self) -> Catalog:
        return tables.load_catalog(self.catalog_name, self.catalog_properties)

    def table(self) -> Table:
        """The table as its catalog has it now (loaded again at each call)."""
        return tables.load_table(self.catalog(), self.table_name, self.label)

    @property
    def label(self) -> str:
        return f"Iceberg table {self.table_name} ({self.catalog_label} catalog)"

    @cached_property
    def store(self) -> Store:
        return Store(json.dumps(io_properties(json.loads(self.catalog_json)), sort_keys=True))

    @cached_property
    def location(self) -> str:
        """The table's location (where a table never moves from)."""
        return self.table().location().rstrip("/")

    @property
    def eos_root(self) -> str:
        return f"{self.location}/{EOS_DIR}"

    def attempt_url(self, attempt: Attempt | str) -> str:
        """The folder of an attempt's files (``rows/``, ``dead_letters/``),
        by its staging name: the window's data files stay there once published."""
        return f"{self.eos_root}/{attempt if isinstance(attempt, str) else attempt.staging}"
