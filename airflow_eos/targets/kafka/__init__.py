"""The Kafka target: each window published into a Kafka topic in one producer
transaction, fenced per window and idempotent, with the ledger in PostgreSQL.

Importing this package loads the spec only (no confluent_kafka, no psycopg): a
DAG file builds a KafkaTarget at parse time. The sink (``KafkaSink``) lives in
:mod:`airflow_eos.targets.kafka.sink`, assembled from ``staging.py`` (begin,
the writer, counts: the PostgreSQL staging table of the PostgreSQL target),
``commit.py`` (its hooks of the core's commit protocol, core/commit.py: the
Kafka transaction, the marker, the ledger's record), ``intent.py`` (commit
intents: the outcome told without an expired marker), ``abort.py`` (what the
abort, the teardown and the sweep settle first) and ``published.py`` (what
verify reads), over the fields declared in ``fields.py``;
``client.py`` holds the Kafka names and clients (transactional.id, marker
group, topic check, marker read).
"""

from airflow_eos.targets.kafka.spec import KafkaTarget

__all__ = ["KafkaTarget"]
