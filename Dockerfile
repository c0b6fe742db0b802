# Airflow 3 with airflow-eos installed, for docker-compose.yml.

# Spark's Kafka connector jars, fetched at build time from the pom scripts/bootstrap.sh uses:
# no Spark process of the image downloads anything at run time.
FROM maven:3.9-eclipse-temurin-17 AS spark-kafka
COPY scripts/spark-kafka/pom.xml /build/pom.xml
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory=/spark-kafka/lib \
 && touch /spark-kafka/.complete

FROM apache/airflow:3.3.2-python3.11
USER root
# Java for spark-submit (client mode against the Spark master in the compose file)
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=spark-kafka /spark-kafka /opt/spark-kafka
# airflow_eos.spark.connector finds the connector's jars here
ENV EOS_SPARK_KAFKA_HOME=/opt/spark-kafka
USER airflow
COPY --chown=airflow:root . /opt/airflow-eos
RUN pip install --no-cache-dir /opt/airflow-eos
