"""The PostgreSQL target: windows published into a table in one transaction
with the pipeline's offsets (the ledger shares the database). The spec,
``PostgresTarget`` (``target.py``), builds its runtime part, ``PostgresSink``
(``sink.py``)."""

from airflow_eos.targets.postgres.target import PostgresTarget

__all__ = ["PostgresTarget"]
