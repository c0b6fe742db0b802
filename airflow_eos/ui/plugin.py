"""The Airflow plugin that puts the window status page into the Airflow UI.

Registered through the ``airflow.plugins`` entry point (pyproject.toml): Airflow
loads entry-point plugins in every process, while a provider's own
``plugins`` list is only read with ``[core] lazy_discover_providers = False``.

Every Airflow process imports this module when it loads plugins (scheduler,
workers, dag-processor): it imports nothing heavy. The FastAPI app is built on
the first request, so only the api-server ever loads it.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/eos"


class LazyStatusApp:
    """An ASGI app that builds airflow_eos.ui.app on its first request."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_eos.ui.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class EosWindowsPlugin(AirflowPlugin):
    name = "airflow_eos"
    fastapi_apps = [{"app": LazyStatusApp(), "url_prefix": URL_PREFIX, "name": "Exactly-once windows"}]
    # In the nav's Browse menu; the UI shows the page inside its own frame at /plugin/eos-windows.
    external_views = [{"name": "Exactly-once windows", "href": URL_PREFIX + "/", "destination": "nav",
                       "category": "browse", "url_route": "eos-windows"}]
