"""The FastAPI app of the window status page, served by Airflow's api-server
under ``/eos`` (see plugin.py).

- ``GET /eos/`` — the page (HTML); ``GET /eos/api/pipelines`` — the same as JSON.
- Read-only: one read-only ledger transaction per request, and the end of each
  log read from Kafka for the lag.
- Behind Airflow's auth like the rest of the UI: the api-server's own
  ``requires_access_dag("GET", RUN)`` dependency (the caller's JWT, from the
  UI's cookie or an ``Authorization: Bearer`` header, checked by the configured
  auth manager); without it the answer is 401, without the permission 403.

Which connections: ``[eos] ui_postgres_conn_id`` (default ``postgres_default``:
the target database, which holds the ledger) and ``[eos] ui_kafka_conn_id``
(default ``kafka_default``; empty: no lag column), e.g. through
``AIRFLOW__EOS__UI_POSTGRES_CONN_ID``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.configuration import conf
from airflow_eos.core.database import redact
from airflow_eos.core.target import DEFAULT_CONN_IDS, KAFKA, POSTGRES
from airflow_eos.ui import status as ui_status
from airflow_eos.ui.page import render

log = logging.getLogger(__name__)

SECTION = "eos"
KAFKA_TIMEOUT = 5.0


def _conn_ids() -> tuple[str, str]:
    return (conf.get(SECTION, "ui_postgres_conn_id", fallback=DEFAULT_CONN_IDS[POSTGRES]),
            conf.get(SECTION, "ui_kafka_conn_id", fallback=DEFAULT_CONN_IDS[KAFKA]))


def read_statuses() -> tuple[list[ui_status.PipelineStatus], str]:
    """Every pipeline's status and where it was read (no secret in it)."""
    from airflow_eos.hooks.eos import EosKafkaHook, EosPostgresHook, ledger_for

    postgres_conn_id, kafka_conn_id = _conn_ids()
    try:
        ledger = ledger_for(postgres_conn_id)
        source = f"Airflow connection {postgres_conn_id!r} ({redact(ledger.url)})"
        statuses = ui_status.read_ledger(ledger)
    except Exception as exc:  # noqa: BLE001 - any failure is shown, redacted, as "unavailable"
        url = None
        try:
            url = EosPostgresHook(postgres_conn_id=postgres_conn_id).ledger_url
        except Exception:  # noqa: BLE001 - the connection itself is what failed
            pass
        message = redact(f"{type(exc).__name__}: {exc}", url)
        log.warning("window status: ledger unreadable through connection %r: %s", postgres_conn_id, message)
        raise HTTPException(503, f"the ledger could not be read through Airflow connection {postgres_conn_id!r}: "
                                 f"{message}. Set [eos] ui_postgres_conn_id to the target database's "
                                 "connection.") from None
    if not kafka_conn_id:
        return [_no_lag(s, "no Kafka connection configured ([eos] ui_kafka_conn_id): no lag shown")
                for s in statuses], source
    topics = sorted({t for s in statuses for t in ui_status.topics_of(s)})
    if not topics:
        return statuses, source
    try:
        from airflow_eos.core.source import KafkaLog

        with KafkaLog(EosKafkaHook(kafka_config_id=kafka_conn_id).kafka_config, timeout=KAFKA_TIMEOUT) as kafka:
            ends = ui_status.read_log_ends(kafka, topics)
    except Exception as exc:  # noqa: BLE001 - the page still shows the ledger
        note = f"the end of the logs could not be read through Kafka connection {kafka_conn_id!r}: " \
               f"{type(exc).__name__}: {redact(str(exc))}; no lag shown"
        log.warning("window status: %s", note)
        return [_no_lag(s, note) for s in statuses], source
    return [ui_status.with_lag(s, {tp: e for tp, e in ends.items() if tp.topic in ui_status.topics_of(s)})
            for s in statuses], source


def _no_lag(s: ui_status.PipelineStatus, note: str) -> ui_status.PipelineStatus:
    return ui_status.PipelineStatus(s.pipeline, s.owner, s.dag_id, s.windows, s.partitions, note, s.verify, s.counts)


def create_app() -> FastAPI:
    app = FastAPI(title="airflow-eos window status", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))])

    @app.get("/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        statuses, source = read_statuses()
        return HTMLResponse(render(statuses, source=source))

    @app.get("/api/pipelines")
    def pipelines() -> dict[str, Any]:
        statuses, source = read_statuses()
        return {"source": source, "pipelines": [s.to_dict() for s in statuses]}

    return app
