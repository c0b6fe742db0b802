"""The file target: each window published as a Parquet partition directory by
the temp-directory-then-rename two-phase commit, with the ledger in PostgreSQL.

Importing this package loads the spec only (no pyarrow, no psycopg): a DAG file
builds a FileTarget at parse time. The sink (``FileSink``) lives in
:mod:`airflow_eos.targets.files.sink`, assembled from ``staging.py`` (where
things are, begin, the writers' folders, seal, prepare), ``commit.py`` (its
hooks of the core's commit protocol, core/commit.py: what the decision records
and the publication after it; core/publication.py finishes decided publications),
``abort.py`` (teardown, sweep) and ``published.py`` (what verify reads), over
the fields declared in ``fields.py``;
the writer and the staging layout are in :mod:`airflow_eos.targets.files.writer`,
the file operations in ``fs.py``, the root's identity and claim in ``identity.py``.
"""

from airflow_eos.targets.files.spec import FileTarget

__all__ = ["FileTarget"]
