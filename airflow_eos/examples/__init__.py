"""The example pipelines of dags/ and the demo: transforms and target tables."""
