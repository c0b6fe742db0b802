"""docker-compose.yml is checked without a Docker engine: its structure, that
every published port is bound to 127.0.0.1, and that what it references exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_the_deployment_has_every_service():
    assert {"kafka", "postgres", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer", "spark-master", "spark-worker", "spark-connect"} <= set(SERVICES)


def test_every_published_port_is_bound_to_loopback():
    published = [(name, p) for name, s in SERVICES.items() for p in s.get("ports", [])]
    assert published, "the UI and Kafka must be reachable from the host"
    for name, port in published:
        assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_references_resolve():
    volumes = set(COMPOSE.get("volumes", {}))
    for name, s in SERVICES.items():
        deps = s.get("depends_on", {})
        for dep in deps if isinstance(deps, (list, dict)) else []:
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
        for v in s.get("volumes", []):
            source = v.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in volumes, f"{name} uses undeclared volume {source}"
        image = s.get("image", "")
        assert s.get("build") or (":" in image and not image.endswith(":latest")) or image == "airflow-eos:latest", \
            f"{name}: pin the image version ({image!r})"
    assert (ROOT / "Dockerfile").exists()


def test_airflow_services_get_the_three_connections():
    env = SERVICES["airflow-scheduler"]["environment"]
    assert json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]["bootstrap.servers"] == "kafka:9092"
    assert env["AIRFLOW_CONN_POSTGRES_DEFAULT"].startswith("postgresql://")
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])["conn_type"] == "spark"
    connect = json.loads(env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert connect["conn_type"] == "spark_connect" and connect["host"] in SERVICES
    assert f"binding.port={connect['port']}" in " ".join(SERVICES["spark-connect"]["command"])
    for name in ("airflow-api-server", "airflow-dag-processor", "airflow-triggerer"):
        assert SERVICES[name]["environment"] == env


AIRFLOW = ("airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
SPARK = ("spark-master", "spark-worker", "spark-connect")


def test_airflow_waits_for_a_healthy_kafka():
    """Kafka has a healthcheck a client answers, and Airflow's init (which the
    other Airflow services wait for) and the topic creation wait for it."""
    kafka = SERVICES["kafka"]["healthcheck"]
    assert "kafka-broker-api-versions.sh --bootstrap-server kafka:9092" in " ".join(kafka["test"])
    assert kafka["retries"] * int(kafka["interval"].rstrip("s")) >= 60  # a minute for a cold start
    assert SERVICES["airflow-init"]["depends_on"]["kafka"] == {"condition": "service_healthy"}
    assert SERVICES["kafka-topics"]["depends_on"]["kafka"] == {"condition": "service_healthy"}
    for name in AIRFLOW[1:]:
        assert SERVICES[name]["depends_on"] == {"airflow-init": {"condition": "service_completed_successfully"}}


def test_every_service_running_the_package_image_builds_it():
    """No service relies on another having built airflow-eos:latest: each one
    that runs it builds it from the Dockerfile (or pulls nothing else)."""
    users = [name for name, s in SERVICES.items() if s.get("image", "").startswith("airflow-eos:")]
    assert set(SPARK) | set(AIRFLOW) | {"airflow-secrets"} <= set(users)
    for name in users:
        assert SERVICES[name].get("build") == ".", f"{name} runs {SERVICES[name]['image']} without building it"
    for name in SPARK:  # started with the image, not after Airflow's init
        deps = SERVICES[name].get("depends_on", {})
        assert "airflow-init" not in deps, f"{name} waits for airflow-init"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git"} <= set(ignored)  # the build context is the sources, not a 1 GB virtualenv


def test_the_api_servers_secrets_are_generated_not_written_here():
    """No fixed JWT or session secret in the file: a one-shot service writes
    random ones into a volume; every Airflow service reads them with Airflow's
    _CMD options (failing to start without them) and waits for that service."""
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text
    env = SERVICES["airflow-scheduler"]["environment"]
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        assert key not in env, f"{key} is written in the compose file"
    assert env["AIRFLOW__API_AUTH__JWT_SECRET_CMD"] == "cat /opt/airflow/secrets/jwt_secret"
    assert env["AIRFLOW__API__SECRET_KEY_CMD"] == "cat /opt/airflow/secrets/api_secret_key"

    generator = SERVICES["airflow-secrets"]
    assert generator["entrypoint"][:2] == ["python", "/opt/airflow-eos/docker/generate_secrets.py"]
    assert "airflow-secrets:/opt/airflow/secrets" in generator["volumes"]
    assert SERVICES["airflow-init"]["depends_on"]["airflow-secrets"] == {
        "condition": "service_completed_successfully"}
    for name in AIRFLOW:
        assert "airflow-secrets:/opt/airflow/secrets:ro" in SERVICES[name]["volumes"], name


def test_the_secret_generator_writes_random_secrets_once(tmp_path):
    """docker/generate_secrets.py as the airflow-secrets service runs it (here
    as the test's user): two long random secrets, only the owner's group can
    read them, kept on a second run. (Airflow reads [api_auth] jwt_secret and
    [api] secret_key through *_CMD because both are sensitive options.)"""
    import stat
    import subprocess
    import sys

    script = ROOT / "docker" / "generate_secrets.py"
    for _ in range(2):
        subprocess.run([sys.executable, str(script), str(tmp_path / "s")], check=True, capture_output=True)
        first = {p.name: p.read_text() for p in (tmp_path / "s").iterdir()}
        if _ == 0:
            generated = first
    assert generated == first and set(first) == {"jwt_secret", "api_secret_key"}
    assert len(set(first.values())) == 2 and all(len(v) >= 64 for v in first.values())
    for p in (tmp_path / "s").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o440

    other = tmp_path / "t"
    subprocess.run([sys.executable, str(script), str(other)], check=True, capture_output=True)
    assert (other / "jwt_secret").read_text() != first["jwt_secret"]


def test_one_apache_kafka_version_everywhere():
    """The broker the tests and the demo run (Maven's jars) is the one the deployment runs."""
    from airflow_eos.embedded import KAFKA_VERSION

    pom = (ROOT / "scripts" / "kafka" / "pom.xml").read_text()
    assert f"<kafka.version>{KAFKA_VERSION}</kafka.version>" in pom
    for name in ("kafka", "kafka-topics"):
        assert SERVICES[name]["image"] == f"apache/kafka:{KAFKA_VERSION}", name
    assert f"Apache Kafka {KAFKA_VERSION}" in (ROOT / "README.md").read_text()


def test_one_spark_version_everywhere():
    """PySpark, the Spark Connect client and Spark's Kafka connector jars are one release:
    the connector's classes are compiled against the Spark they run in."""
    pins = dict(re.findall(r'"(pyspark|pyspark-client)==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()))
    pom = (ROOT / "scripts" / "spark-kafka" / "pom.xml").read_text()
    assert pins["pyspark"] == pins["pyspark-client"]
    assert f"<spark.version>{pins['pyspark']}</spark.version>" in pom
    from airflow_eos.spark.connector import SPARK_VERSION

    assert SPARK_VERSION == pins["pyspark"]


def test_the_hdfs_of_the_tests_is_the_hadoop_release_of_sparks_client():
    """The mini-cluster's jars (Maven) are the release of the Hadoop client PySpark ships: Spark's
    hdfs:// paths in the tests talk to the NameNode of that release."""
    from airflow_eos.embedded import HADOOP_VERSION

    pom = (ROOT / "scripts" / "hdfs" / "pom.xml").read_text()
    assert f"<hadoop.version>{HADOOP_VERSION}</hadoop.version>" in pom
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    assert [p.name for p in jars.glob("hadoop-client-api-*.jar")] == [f"hadoop-client-api-{HADOOP_VERSION}.jar"]


def test_the_schema_registry_built_is_the_one_the_tests_start():
    from airflow_eos.embedded import SCHEMA_REGISTRY_VERSION

    pom = (ROOT / "scripts" / "schema-registry" / "pom.xml").read_text()
    assert f"<apicurio.version>{SCHEMA_REGISTRY_VERSION}</apicurio.version>" in pom


def test_the_rest_catalog_of_the_tests_is_the_iceberg_release_its_pom_names():
    """The REST catalog server's jars (Maven) are the Iceberg release the embedded service names, so that
    iceberg_rest_home() finds what scripts/bootstrap.sh fetched."""
    from airflow_eos.embedded import ICEBERG_VERSION

    pom = (ROOT / "scripts" / "iceberg-rest" / "pom.xml").read_text()
    assert f"<iceberg.version>{ICEBERG_VERSION}</iceberg.version>" in pom


def test_the_s3a_jars_are_the_hadoop_release_of_sparks_client():
    """hadoop-aws (Spark's s3a:// writes of an Iceberg table's files on S3) is the release of the Hadoop
    client PySpark ships, and make setup fetched it."""
    from airflow_eos.embedded import HADOOP_VERSION
    from airflow_eos.spark.connector import S3A_HADOOP_VERSION, s3a_jars

    pom = (ROOT / "scripts" / "spark-s3a" / "pom.xml").read_text()
    assert S3A_HADOOP_VERSION == HADOOP_VERSION and f"<hadoop.version>{HADOOP_VERSION}</hadoop.version>" in pom
    assert any(Path(j).name == f"hadoop-aws-{HADOOP_VERSION}.jar" for j in s3a_jars())


def test_a_kafka_cluster_id_never_starts_with_a_dash():
    """The StorageTool reads an id starting with "-" as an option: one broker start in 64 failed so in a soak."""
    from airflow_eos.embedded import cluster_id

    draws = iter([bytes([0xF8]) + bytes(15), bytes([0x01]) + bytes(15)])  # the first encodes as "-AAA..."
    assert cluster_id(lambda: next(draws)) == "AQAAAAAAAAAAAAAAAAAAAA"
    ids = {cluster_id() for _ in range(2000)}
    assert len(ids) == 2000 and not any(i.startswith("-") for i in ids)


def test_every_spark_of_the_deployment_has_the_kafka_connector_without_downloading_it():
    """The image bakes the connector's jars in from the pom the bootstrap uses, and names them with
    EOS_SPARK_KAFKA_HOME; the Connect server starts with them (spark-submit's jars reach the
    cluster's executors from the stage hook)."""
    from airflow_eos.spark.connector import HOME_ENV

    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY scripts/spark-kafka/pom.xml" in dockerfile and "dependency:copy-dependencies" in dockerfile
    assert f"ENV {HOME_ENV}=" in dockerfile
    command = " ".join(SERVICES["spark-connect"]["command"])
    assert "--jars" in command and "kafka_connector_jars" in command
    assert "--packages" not in command and "spark.jars.packages" not in command


def test_a_missing_connector_names_make_setup(tmp_path, monkeypatch):
    from airflow_eos.spark.connector import HOME_ENV, kafka_connector_jars

    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match="make setup"):
        kafka_connector_jars()
    monkeypatch.delenv(HOME_ENV)
    jars = kafka_connector_jars()
    assert any(j.endswith("spark-sql-kafka-0-10_2.13-4.2.0.jar") for j in jars)
    assert any("kafka-clients" in j for j in jars)
