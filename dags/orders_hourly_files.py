"""The example DAG ``orders_hourly_files``: orders, hour by hour, from Kafka
into a directory of Parquet files (one partition directory per window),
exactly once.

Its source is ``airflow_eos/examples/dags/orders_hourly_files.py``, inside the
package (as orders_hourly's); importing it here puts it in this DAG folder.
"""

from airflow_eos.examples.dags.orders_hourly_files import dag  # noqa: F401
