"""The package's layering as a checked contract: ``lint-imports`` with the
contracts in pyproject.toml ([tool.importlinter]): window over operators and
sensors over triggers over hooks over spark over targets over staging over
core, no import cycle between sibling modules (imports inside functions
count), the targets independent of each other, and no generic package
importing a target (they reach one through the registry). Run here so that
``make test`` (and CI) fails on an import that breaks them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), f"{lint_imports} is missing: run `make setup` (import-linter is in the dev extra)"
    done = subprocess.run([str(lint_imports), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-5000:]
