"""Generate the Airflow deployment's secrets once, into the shared volume
docker-compose.yml mounts at /opt/airflow/secrets (the ``airflow-secrets``
service runs this before ``airflow-init``).

Each secret is a file holding 64 random URL-safe bytes from ``secrets``, written
only if missing (a restart keeps the JWTs and sessions already issued valid),
readable by the airflow user (uid 50000, group root) and nobody else. Airflow
reads them through its ``_CMD`` options (``AIRFLOW__API_AUTH__JWT_SECRET_CMD``,
``AIRFLOW__API__SECRET_KEY_CMD``), so no secret is in the compose file, an
image, or ``docker inspect``. Rotate: ``docker compose down`` and delete the
volume ``airflow-secrets`` (every issued token becomes invalid).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

NAMES = ("jwt_secret", "api_secret_key")
AIRFLOW_UID, ROOT_GID = 50000, 0


def main(directory: str = "/opt/airflow/secrets") -> int:
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        path = root / name
        if path.exists() and path.read_text().strip():
            print(f"{path}: kept")
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o440)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(64))
        print(f"{path}: generated")
    for path in [root, *(root / n for n in NAMES)]:
        if os.geteuid() == 0:
            os.chown(path, AIRFLOW_UID, ROOT_GID)
        os.chmod(path, 0o550 if path == root else 0o440)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
