"""The example DAG ``orders_hourly``: orders, hour by hour, from Kafka into
PostgreSQL, exactly once.

Its source is ``airflow_eos/examples/dags/orders_hourly.py``, inside the
package, so that ``airflow-eos demo`` runs this very DAG from an installed
wheel; importing it here puts it in this DAG folder (Airflow collects a
module-level DAG and records this file as its location).
"""

from airflow_eos.examples.dags.orders_hourly import dag  # noqa: F401
