"""The registry of target kinds: where each kind's spec class is.

A kind is the package's own (:data:`BUILTIN_KINDS`, one line per target) or
another distribution's (an entry point in :data:`ENTRY_POINT_GROUP`). Generic
code finds a target only here, by importing its spec class by name at run
time (core/target.py's ``spec_class``), never by an import statement. This
module knows nothing of the spec interface, so that the ledger's migration
runner (core/schema.py), which the spec interface sits above, can ask every
kind for its own tables too.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from airflow_eos.core.errors import ConfigurationError

# kind -> "module:Class" of the targets that ship with the package.
BUILTIN_KINDS = {
    "postgres": "airflow_eos.targets.postgres:PostgresTarget",
    "files": "airflow_eos.targets.files:FileTarget",
    "kafka": "airflow_eos.targets.kafka:KafkaTarget",
    "iceberg": "airflow_eos.targets.iceberg:IcebergTarget",
}
ENTRY_POINT_GROUP = "airflow_eos.targets"


@cache
def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_kinds() -> list[str]:
    """Every target kind a spec can name: the package's own and those other
    distributions register under :data:`ENTRY_POINT_GROUP`."""
    return sorted({*BUILTIN_KINDS, *_entry_points()})


def kind_class(kind: str) -> Any:
    """The spec class registered for ``kind`` (a ``TargetSpec`` subclass)."""
    where = BUILTIN_KINDS.get(kind) or _entry_points().get(kind)
    if where is None:
        known = registered_kinds()
        raise ConfigurationError(f"unknown target kind {kind!r}: known kinds are {known} (a third-party target "
                                 f"registers its spec class under the entry point group {ENTRY_POINT_GROUP!r})")
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)
