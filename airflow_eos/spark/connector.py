"""Where Spark's Kafka connector (``spark.read.format("kafka")``) comes from: its
jars, fetched once by ``make setup`` (scripts/bootstrap.sh, Maven, from
scripts/spark-kafka/pom.xml) into a cache outside the checkout. Every Spark this
package starts puts them on its classpath from there (the local session's and the
Spark Connect server's ``spark.jars``, spark-submit's ``--jars``, which also ships
them to a cluster's executors); no Spark process downloads anything at run time.
The Docker image bakes the same jars in (Dockerfile) and names them with
``EOS_SPARK_KAFKA_HOME``.

Beside them, where ``make setup`` fetched them (scripts/spark-s3a/pom.xml), Hadoop's
S3A file system (``s3a://``), with which Spark's own writer stages an Iceberg
table's files on S3; without them (the Docker image) only an ``s3a://`` write
fails ("No FileSystem for scheme")."""

from __future__ import annotations

from pathlib import Path

from airflow_eos.core.jars import JarCache

SPARK_VERSION = "4.2.0"  # scripts/spark-kafka/pom.xml's spark.version; tests/unit/test_deployment.py checks both
HOME_ENV = "EOS_SPARK_KAFKA_HOME"
CONNECTOR_JAR = f"spark-sql-kafka-0-10_2.13-{SPARK_VERSION}.jar"
S3A_HOME_ENV = "EOS_SPARK_S3A_HOME"
S3A_HADOOP_VERSION = "3.5.0"  # PySpark's Hadoop client's; scripts/spark-s3a/pom.xml's hadoop.version

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


S3A = JarCache(f"spark-s3a-{S3A_HADOOP_VERSION}", f"Hadoop {S3A_HADOOP_VERSION}'s S3A jars", S3A_HOME_ENV,
               "hadoop-aws-*.jar", "scripts/spark-s3a/pom.xml")


def s3a_jars() -> list[str]:
    """hadoop-aws and the AWS SDK modules it uses, if ``make setup`` fetched
    them; none otherwise (only an ``s3a://`` write then fails)."""
    try:
        return S3A.jars()
    except RuntimeError:
        return []


def connector_jars() -> list[str]:
    """What every Spark this package starts puts on its classpath beside
    pyspark's own jars: the Kafka connector's and the S3A file system's."""
    return [*kafka_connector_jars(), *s3a_jars()]


__all__ = ["CONNECTOR_JAR", "HOME_ENV", "S3A", "S3A_HADOOP_VERSION", "S3A_HOME_ENV", "SPARK_VERSION", "connector_home",
           "connector_jars", "kafka_connector_jars", "s3a_jars"]
