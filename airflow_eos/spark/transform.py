"""A window's transform, named ``"module:function"``: its syntax checked when a
DAG is parsed, the function loaded where the job runs, and checked by the stage
operator before it submits a job that could not load it.

No pyspark import here: loading a user's module may import it, checking a name never does.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable
from typing import Any

from airflow_eos.core.errors import ConfigurationError

log = logging.getLogger(__name__)


def parse_transform(spec: str) -> tuple[str, str]:
    """``(module, attribute path)`` of ``"package.module:function"`` (the
    function may be a dotted attribute path); ConfigurationError otherwise."""
    module_name, sep, attr = str(spec).partition(":")
    names = [*module_name.split("."), *attr.split(".")]
    if not sep or not all(n.isidentifier() for n in names):
        raise ConfigurationError(f"transform must be 'module:function' (e.g. 'my_pkg.transforms:orders'), "
                                 f"got {spec!r}")
    return module_name, attr


def load_transform(spec: str | Callable | None) -> Callable | None:
    """``module:function``, a callable, or None (stage the records as read).
    A module that does not import, a missing attribute or one that is not
    callable is a ConfigurationError whose first words are the cause."""
    if spec is None or callable(spec):
        return spec
    module_name, attr = parse_transform(spec)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised is the cause to report
        raise ConfigurationError(f"{type(exc).__name__}: {exc} (transform {spec!r}: cannot import "
                                 f"{module_name!r} where this runs)") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"transform {spec!r}: module {module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise ConfigurationError(f"transform {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def check_transform(spec: str | None, *, shipped: bool = False) -> None:
    """What the stage operator checks before it submits a job: the transform's
    module imports on this worker and has the function, callable. With
    ``shipped`` (the job gets its code through ``py_files``), a module not
    importable here is no error: the job loads it from what is shipped and
    reports there; only the name's syntax was checked."""
    if spec is None:
        return
    module_name, _ = parse_transform(spec)
    if shipped and importlib.util.find_spec(module_name.split(".")[0]) is None:
        log.info("transform %r: module %r is not installed on this worker; it ships with py_files, so "
                 "the stage job loads and checks it", spec, module_name)
        return
    load_transform(spec)
