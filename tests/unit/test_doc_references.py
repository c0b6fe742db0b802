"""Every Markdown file the repository's docs and sources point a reader to
exists in the repository (issue 33: docs/guarantees.md sent readers to a
notes file on the build machines, not in the repository)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a file name ending in .md, not part of a URL
MD_NAME = re.compile(r"(?<![\w/.:-])([\w./-]+\.md)\b")
OTHER_PROJECTS = {"CONFIGURATION.md"}  # librdkafka's list of its properties


def _tracked(*suffixes):
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / f for f in files.splitlines() if f.endswith(suffixes)]


def test_every_markdown_file_named_in_docs_and_sources_exists():
    tracked = _tracked(".md")
    names = {p.name for p in tracked}
    missing = []
    for source in _tracked(".md", ".py"):
        for lineno, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for name in MD_NAME.findall(line):
                if not ((ROOT / name).is_file() or (source.parent / name).is_file() or Path(name).name in names
                        or name in OTHER_PROJECTS):
                    missing.append(f"{source.relative_to(ROOT)}:{lineno}: {name}")
    assert missing == [], missing
