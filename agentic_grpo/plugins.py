"""Import plug-ins by path (`module.sub:Name`), as recipes name them, with errors that say what to fix."""

from __future__ import annotations

import importlib
from typing import Any


class PluginError(ValueError):
    """A recipe names something that cannot be imported."""


def import_object(path: str, what: str = "object") -> Any:
    """Import `module:attr` (or `module.attr`); raise PluginError naming the path and the reason."""
    if not isinstance(path, str) or not path.strip():
        raise PluginError(f"{what} must be an import path like `package.module:Name`, got {path!r}")
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise PluginError(f"{what} `{path}` is not an import path like `package.module:Name`")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"{what} `{path}`: cannot import module `{module_name}`: {exc}") from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        names = ", ".join(n for n in dir(module) if not n.startswith("_"))
        raise PluginError(f"{what} `{path}`: module `{module_name}` has no `{attr}` (it has: {names})") from None
    return obj
