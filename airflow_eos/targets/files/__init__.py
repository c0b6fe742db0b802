"""The file target: each window published as a Parquet partition directory by
the temp-directory-then-rename two-phase commit, with the ledger in PostgreSQL.

Importing this package loads the spec only (no pyarrow, no psycopg): a DAG file
builds a FileTarget at parse time. The sink (``FileSink``) lives in
:mod:`airflow_eos.targets.files.sink`, assembled from ``staging.py`` (where
things are, begin, the writers' folders, seal, prepare), ``commit.py`` (the
decision and the publication), ``finish.py`` (finishing decided publications),
``abort.py`` (abort, teardown, sweep) and ``published.py`` (what verify reads);
the writer and the staging layout are in :mod:`airflow_eos.targets.files.writer`,
the file operations in ``fs.py``, the root's identity and claim in ``identity.py``.
"""

from airflow_eos.targets.files.spec import FileTarget

__all__ = ["FileTarget"]
