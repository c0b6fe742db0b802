"""docker-compose.yml is checked without a Docker engine: its structure, that
every published port is bound to 127.0.0.1, and that what it references exists."""

from __future__ import annotations

import json
from pathlib import Path

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
