"""The Iceberg target: each window appended to an Apache Iceberg table in one
snapshot, exactly once, the ledger's decision first and the table's commit
after it, idempotent by a commit token in the snapshot's summary.

Importing this package loads the spec only (no pyiceberg, no pyarrow): a DAG
file builds an IcebergTarget at parse time. The sink (``IcebergSink``) lives
in :mod:`airflow_eos.targets.iceberg.sink`, assembled from ``staging.py``
(where an attempt's files are, begin, the writers, seal, prepare),
``commit.py`` (its hooks of the core's commit protocol and the table's
commit), ``abort.py`` (teardown, sweep) and ``published.py`` (what verify
reads); ``table.py`` holds the catalog, the table and its snapshot
summaries, ``files.py`` the file operations (local or object store),
``writer.py`` the Python writer of the stage's write tasks.
"""

from airflow_eos.targets.iceberg.spec import IcebergTarget

__all__ = ["IcebergTarget"]
