# Airflow 3 with airflow-eos installed, for docker-compose.yml.
FROM apache/airflow:3.3.2-python3.11
USER root
# Java for spark-submit (client mode against the Spark master in the compose file)
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow:root . /opt/airflow-eos
RUN pip install --no-cache-dir /opt/airflow-eos
