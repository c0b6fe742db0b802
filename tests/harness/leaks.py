"""What a leaked password looks like, for tests that prove none leaks."""

from __future__ import annotations

from urllib.parse import unquote

# A raw "@" and ":" inside, and an encoded "@" (%40) that libpq decodes.
PASSWORD = "S3cr3t@p:w%40x"


def fragments(password: str = PASSWORD) -> set[str]:
    """Every piece of the password longer than 2 characters, as written and decoded."""
    return {s[i:i + 3] for s in (password, unquote(password)) for i in range(len(s) - 2)}


def leaked(text: str, password: str = PASSWORD) -> list[str]:
    """The pieces of ``password`` found in ``text``; [] when none leaked."""
    return sorted(f for f in fragments(password) if f in text)
