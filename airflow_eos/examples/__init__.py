"""The example pipelines of dags/ and the demo: transforms, target tables, and the
demo's DAG (examples/dags/, shipped in the wheel; dags/orders_hourly.py imports it)."""
