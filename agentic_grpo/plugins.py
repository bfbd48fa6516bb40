"""Import plug-ins by path (`module.sub:Name`), as recipes name them, with errors that say what to fix."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


class PluginError(ValueError):
    """A recipe names something that cannot be imported."""


def add_working_directory_to_path() -> None:
    """Let recipes name the user's own modules from the directory they run in, as `python train.py` does.

    The console script (`agentic-grpo train`) and `accelerate launch` do not put the working
    directory on `sys.path`; `python script.py` puts the script's. Built-ins live under
    `agentic_grpo.*`, so a user's `tools` or `rewards` package never collides with them.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_object(path: str, what: str = "object") -> Any:
    """Import `module:attr` (or `module.attr`); raise PluginError naming the path and the reason."""
    if not isinstance(path, str) or not path.strip():
        raise PluginError(f"{what} must be an import path like `package.module:Name`, got {path!r}")
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise PluginError(f"{what} `{path}` is not an import path like `package.module:Name`")
    add_working_directory_to_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        where = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0]:
            where = (f" (plug-ins are imported from the current directory, {os.getcwd()}, and PYTHONPATH: run from the "
                     "folder that holds it, or add that folder to PYTHONPATH)")  # fmt: skip
        raise PluginError(f"{what} `{path}`: cannot import module `{module_name}`: {exc}{where}") from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        names = ", ".join(n for n in dir(module) if not n.startswith("_"))
        raise PluginError(f"{what} `{path}`: module `{module_name}` has no `{attr}` (it has: {names})") from None
    return obj


def check_options(target: Any, options: dict[str, Any], where: str, extra: tuple[str, ...] = ()) -> None:
    """Raise PluginError naming an option `target`'s constructor does not take, with a "did you mean".

    `extra` are keys the caller itself understands (a reward entry's `weight`, say), offered as
    suggestions too. A constructor with `**kwargs` takes anything.
    """
    import difflib
    import inspect

    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    known = [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, known + list(extra), n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"it takes: {', '.join(known + list(extra)) or 'none'}"
            raise PluginError(f"{where}: option `{key}` is not known; {hint}")
