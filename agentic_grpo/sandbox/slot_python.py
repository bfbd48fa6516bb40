"""The Python a slot runs: the base interpreter's standard library plus the packages a tool allows, nothing else.

The trainer's environment holds the task generators (reasoning-gym, `agentic_grpo.tasks`,
`tools.toolbox_tasks`): code that could import them could regenerate the training data and print
the gold answer. So a slot never sees the trainer's site-packages, virtual environment or source
tree (`trainer_paths`, hidden on both layers), and runs a small venv-like prefix instead
(`slot_python`): a `pyvenv.cfg` naming the base interpreter, and a site-packages holding hard
links (or copies, across file systems) of just the allowed packages. It is built once per
package set and interpreter and kept on disk next to the slot workspaces, so later pools and
processes reuse it; a package upgrade changes its key and a new one is built.

Standard library only, and nothing imported at module level beyond it: `sandbox exec` stays fast.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PACKAGES = ("numpy", "sympy", "mpmath")
_FORMAT = 1  # bump when the layout of a built prefix changes: old ones are then never reused
_BUILD_LOCK = threading.Lock()
_BUILT: dict[tuple[str, tuple[str, ...]], SlotPython] = {}


@dataclass(frozen=True)
class SlotPython:
    """A built slot interpreter.

    Attributes:
        root: the prefix a slot gets read-only (pyvenv.cfg, bin/python3, lib/pythonX.Y/site-packages).
        executable: what to run inside the slot (a link to the base interpreter; `pyvenv.cfg` makes it
            use `root`'s site-packages).
        packages: the requested packages found in the trainer's environment and installed in `root`.
        missing: the requested packages the trainer's environment does not have.
    """

    root: str
    executable: str
    packages: tuple[str, ...]
    missing: tuple[str, ...]


def base_executable() -> str:
    """The real interpreter binary behind the trainer's (a venv's `python` is a link to, or names, it)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def stdlib_dirs() -> list[str]:
    """The base installation's standard library directories (the .py one and lib-dynload), as on `sys.path`."""
    found = []
    for entry in sys.path:
        if not entry:
            continue
        path = os.path.realpath(entry)
        if os.path.isfile(os.path.join(path, "os.py")) or os.path.basename(path) == "lib-dynload":
            if path not in found and os.path.isdir(path):
                found.append(path)
    return found


def interpreter_paths() -> list[str]:
    """What a slot must read to run the base interpreter: its binary, its prefix's `lib` and the standard library.

    `lib` holds libpython and, for conda-like prefixes, the shared libraries of the standard library's
    extensions; its site-packages is hidden (`trainer_paths`). Never the venv, never the whole prefix.
    """
    exe = base_executable()
    paths = [exe, os.path.realpath(os.path.join(sys.base_prefix, "lib")), *stdlib_dirs()]
    if sys.base_exec_prefix != sys.base_prefix:
        paths.append(os.path.realpath(os.path.join(sys.base_exec_prefix, "lib")))
    keep: list[str] = []
    for path in sorted({p for p in paths if os.path.exists(p)}):
        if not any(path.startswith(k + "/") for k in keep):
            keep.append(path)
    return keep


@functools.cache
def trainer_paths() -> tuple[str, ...]:
    """What slots must never see: the trainer's site-packages (every prefix's, and the user's), its virtual
    environment, its `sys.path` entries that are not the standard library, and this project's source tree.

    A path that holds something a slot needs (the standard library, a workspace) is left out where the
    spawners apply these (`bwrap.hidden_paths`).
    """
    import site

    found: set[str] = set()
    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    if hasattr(site, "getsitepackages"):
        found.update(site.getsitepackages(prefixes))
    if hasattr(site, "getusersitepackages"):
        found.add(site.getusersitepackages())
    if sys.prefix != sys.base_prefix:
        found.add(sys.prefix)
    found.update(entry or os.getcwd() for entry in sys.path)
    found.add(str(Path(__file__).resolve().parents[2]))  # holds agentic_grpo/ (editable: the checkout)
    stdlib = set(stdlib_dirs())
    paths = {os.path.realpath(p) for p in found if p}
    return tuple(sorted(p for p in paths if os.path.exists(p) and p not in stdlib and p != "/"))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _sources(name: str) -> list[str] | None:
    """The files and directories of an importable top-level package: itself, its `.libs`, its dist-info.

    None when it cannot be found (or is a namespace package); [] when the standard library has it.
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None  # absent, or a namespace package (its parts could be anywhere): not supported
    origin = os.path.realpath(spec.origin)
    main = os.path.dirname(origin) if spec.submodule_search_locations else origin
    parent = os.path.dirname(main)
    if parent in stdlib_dirs():
        return []  # the standard library's own: slots have it already
    found = [main]
    libs = os.path.join(parent, f"{name}.libs")  # auditwheel's vendored shared libraries (numpy.libs)
    if os.path.isdir(libs):
        found.append(libs)
    try:
        entries = os.listdir(parent)
    except OSError:
        entries = []
    for entry in entries:
        if not entry.endswith(".dist-info"):
            continue
        info = os.path.join(parent, entry)
        if _canonical(entry.split("-")[0]) == _canonical(name):
            found.append(info)
            continue
        try:
            with open(os.path.join(info, "top_level.txt")) as f:
                if name in f.read().split():
                    found.append(info)
        except OSError:
            pass
    return found


def _key(packages: tuple[str, ...], sources: dict[str, list[str]]) -> str:
    """Names a build: same interpreter, same packages at the same places and times -> the same prefix."""
    stamp = []
    for name in packages:
        for path in sources.get(name, []):
            info = os.stat(path)
            init = os.path.join(path, "__init__.py")
            inner = os.stat(init).st_mtime_ns if os.path.isfile(init) else 0
            stamp.append([path, info.st_mtime_ns, info.st_size if not os.path.isdir(path) else 0, inner])
    text = json.dumps([_FORMAT, base_executable(), sys.version, packages, stamp])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _cache_dir(parent: str) -> Path:
    """This uid's directory of built prefixes: readable by slot uids, writable by this uid alone."""
    directory = Path(parent) / f"agentic-grpo-python-{os.geteuid()}"
    try:
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)  # whatever the umask: slot uids must reach the prefixes
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        # Someone else made it (or can write it): they could plant the packages a slot imports.
        raise RuntimeError(f"{directory} must be a directory of uid {os.geteuid()} that no one else can write")
    return directory


def _link_or_copy(src: str, dst: str) -> str:
    """A hard link (instant, no space) where allowed and readable by every uid; a copy readable by all otherwise."""
    try:
        if os.stat(src).st_mode & 0o004:
            os.link(src, dst)
            return dst
    except OSError:
        pass  # another file system, or protected_hardlinks
    shutil.copy2(src, dst)
    os.chmod(dst, os.stat(dst).st_mode | 0o444)
    return dst


def _build(target: Path, sources: dict[str, list[str]]) -> None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    exe = base_executable()
    (target / "bin").mkdir(mode=0o755)
    for name in ("python", "python3", f"python{version}"):
        os.symlink(exe, target / "bin" / name)
    # A venv's marker: the interpreter reads it beside its own (unresolved) path, takes its standard library
    # from `home`, and adds only this prefix's site-packages (include-system-site-packages = false).
    (target / "pyvenv.cfg").write_text(
        f"home = {os.path.dirname(exe)}\ninclude-system-site-packages = false\nversion = {sys.version.split()[0]}\n"
    )
    site = target / "lib" / f"python{version}" / "site-packages"
    site.mkdir(mode=0o755, parents=True)
    for paths in sources.values():
        for path in paths:
            destination = site / os.path.basename(path)
            if os.path.isdir(path):
                shutil.copytree(path, destination, copy_function=_link_or_copy)
            else:
                _link_or_copy(path, str(destination))
    for directory, _, _ in os.walk(target):
        os.chmod(directory, 0o755)
    (target / "pyvenv.cfg").chmod(0o644)
    (target / "files").write_text(str(_count_files(target) + 1))  # and itself
    (target / "files").chmod(0o644)


def _count_files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def _intact(root: Path) -> bool:
    """Whether a built prefix is whole: a temp cleaner (systemd-tmpfiles) may have removed old files from it."""
    try:
        return _count_files(root) == int((root / "files").read_text())
    except (OSError, ValueError):
        return False


def slot_python(packages: tuple[str, ...] | list[str] | None = None, parent: str | None = None) -> SlotPython:
    """The slot interpreter with `packages` importable (default `DEFAULT_PACKAGES`), built on first use.

    Args:
        packages: top-level import names, copied from the trainer's environment with their dist-info; list
            dependencies too (sympy needs mpmath). Names the trainer does not have are skipped (`missing`).
        parent: where built prefixes are kept (the pool's workspace parent; default the temp directory).

    Thread-safe; processes that build the same prefix at once each build their own and keep the first.
    """
    wanted = tuple(sorted(set(DEFAULT_PACKAGES if packages is None else packages)))
    parent = parent or tempfile.gettempdir()
    with _BUILD_LOCK:
        built = _BUILT.get((parent, wanted))
        if built is not None and os.path.isfile(os.path.join(built.root, "files")):
            return built
        sources = {name: found for name in wanted if (found := _sources(name)) is not None}
        missing = tuple(name for name in wanted if name not in sources)
        cache = _cache_dir(parent)
        root = cache / _key(wanted, sources)
        if root.exists() and not _intact(root):
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=cache))
            try:
                os.rename(root, stale / "prefix")
            except OSError:
                pass  # another process moved it first
            shutil.rmtree(stale, ignore_errors=True)
        if not (root / "files").is_file():
            scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
            try:
                _build(scratch, sources)
                os.rename(scratch, root)
            except OSError:
                if not (root / "files").is_file():
                    raise
            finally:
                if scratch.exists():
                    shutil.rmtree(scratch, ignore_errors=True)  # another process's build won the rename
        built = SlotPython(str(root), str(root / "bin" / "python3"), tuple(sources), missing)
        _BUILT[(parent, wanted)] = built
        return built


__all__ = ["DEFAULT_PACKAGES", "SlotPython", "base_executable", "interpreter_paths", "slot_python", "trainer_paths"]
