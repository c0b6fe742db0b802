"""The file target: each window published as a Parquet partition directory by
the temp-directory-then-rename two-phase commit, with the ledger in PostgreSQL.

Importing this package loads the spec only (no pyarrow, no psycopg): a DAG file
builds a FileTarget at parse time. The sink lives in
:mod:`airflow_eos.targets.files.sink`, the writer and the staging layout in
:mod:`airflow_eos.targets.files.writer`.
"""

from airflow_eos.targets.files.spec import FileTarget

__all__ = ["FileTarget"]
