"""A Spark session for the tests that need one of their own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_session(app_name: str, **options) -> Iterator:
    """``airflow_eos.spark.spark_session(app_name, **options)``, logging only
    errors (a local session), stopped with the JVM it started when the block
    ends, so a module leaves no process behind."""
    from airflow_eos.spark import spark_session, stop_session
    from airflow_eos.spark.session import is_remote

    session = spark_session(app_name, **options)
    try:
        if not is_remote(session):
            session.sparkContext.setLogLevel("ERROR")
        yield session
    finally:
        stop_session(session)
