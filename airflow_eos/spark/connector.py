"""Where Spark's Kafka connector (``spark.read.format("kafka")``) comes from: its
jars, fetched once by ``make setup`` (scripts/bootstrap.sh, Maven, from
scripts/spark-kafka/pom.xml) into a cache outside the checkout. Every Spark this
package starts puts them on its classpath from there (the local session's and the
Spark Connect server's ``spark.jars``, spark-submit's ``--jars``, which also ships
them to a cluster's executors); no Spark process downloads anything at run time.
The Docker image bakes the same jars in (Dockerfile) and names them with
``EOS_SPARK_KAFKA_HOME``."""

from __future__ import annotations

from pathlib import Path

from airflow_eos.core.jars import JarCache

SPARK_VERSION = "4.2.0"  # scripts/spark-kafka/pom.xml's spark.version; tests/unit/test_deployment.py checks both
HOME_ENV = "EOS_SPARK_KAFKA_HOME"
CONNECTOR_JAR = f"spark-sql-kafka-0-10_2.13-{SPARK_VERSION}.jar"


CONNECTOR = JarCache(f"spark-kafka-{SPARK_VERSION}", f"Spark's Kafka connector ({CONNECTOR_JAR}) and its jars",
                     HOME_ENV, CONNECTOR_JAR, "scripts/spark-kafka/pom.xml")


def connector_home() -> Path:
    """The directory whose ``lib/`` holds the connector's jars (``EOS_SPARK_KAFKA_HOME``,
    else where scripts/bootstrap.sh puts them)."""
    return CONNECTOR.home()


def kafka_connector_jars() -> list[str]:
    """The paths of Spark's Kafka connector jars and what they need beyond
    pyspark's own jars; a clear error when ``make setup`` has not fetched them."""
    return CONNECTOR.jars()


__all__ = ["CONNECTOR_JAR", "HOME_ENV", "SPARK_VERSION", "connector_home", "kafka_connector_jars"]
