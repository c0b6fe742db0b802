"""The example DAG ``orders_hourly_avro``: orders in Avro (Confluent's wire
format, a schema registry), hour by hour, from Kafka into PostgreSQL, exactly
once; bad records are dead letters with their reason.

Its source is ``airflow_eos/examples/dags/orders_hourly_avro.py``, inside the
package, beside ``orders_hourly``; importing it here puts it in this DAG folder.
"""

from airflow_eos.examples.dags.orders_hourly_avro import dag  # noqa: F401
