"""Slots run the standard library plus the packages a tool allows, never the trainer's environment.

The trainer's environment holds the task generators: a slot that could import reasoning-gym or
agentic_grpo could regenerate the training data and print the gold answer (#46 item 1).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
import sysconfig
from pathlib import Path

import pytest

from agentic_grpo.sandbox import SandboxConfig, SandboxPool, bwrap, landlock, slot_python
from agentic_grpo.sandbox.checks import Context, run_attack

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import importlib, json
out = {}
for name in NAMES:
    try:
        importlib.import_module(name)
        out[name] = "ok"
    except ImportError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def pool():
    pool = SandboxPool(SandboxConfig(timeout_s=60))
    yield pool
    pool.close()


def imports(slot, names, **kwargs) -> dict:
    result = slot.run_python(f"NAMES = {list(names)!r}\n" + PROBE, **kwargs)
    assert result.exit_code == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def test_a_slot_imports_the_standard_library_and_the_short_list_but_not_the_trainer(pool):
    allowed = ["json", "sqlite3", "ctypes", *(n for n in slot_python.DEFAULT_PACKAGES if installed(n))]
    trainer = [n for n in ("agentic_grpo", "reasoning_gym", "trl", "torch", "transformers") if installed(n)]
    site_packages = sysconfig.get_paths()["purelib"]  # where the trainer's packages live
    with pool.acquire() as slot:
        seen = imports(slot, [*allowed, *trainer])
        listing = slot.run_python(f"import os; print(os.listdir({site_packages!r}))")
    assert {n: seen[n] for n in allowed} == dict.fromkeys(allowed, "ok")
    assert {n: seen[n] for n in trainer} == dict.fromkeys(trainer, "ModuleNotFoundError")
    assert listing.exit_code != 0 or listing.stdout.strip() == "[]", listing.stdout[:300]


def test_a_tool_environment_chooses_what_its_code_may_import(pool):
    from agentic_grpo.tools.python import PythonInterpreter

    if not installed("numpy") or not installed("mpmath"):
        pytest.skip("needs numpy and mpmath installed")

    class OnlyMpmath(PythonInterpreter):
        sandbox_packages = ("mpmath",)

    with pool.acquire() as slot:
        tool = OnlyMpmath()
        tool.sandbox, tool.workspace = slot, slot.workspace
        assert tool.python("import mpmath; print(mpmath.sqrt(4))").output == "2.0"
        assert "No module named 'numpy'" in tool.python("import numpy").output
        assert imports(slot, ["numpy"])["numpy"] == "ok"  # the default list, another prefix
    assert slot_python.slot_python(("mpmath",)).root != slot_python.slot_python().root


def test_the_attack_reports_harm_when_a_slot_gets_the_trainers_environment(pool, monkeypatch):
    """Plant the bug this guards against: the slot runs the trainer's interpreter with its venv and source bound."""
    if not installed("reasoning_gym"):
        pytest.skip("reasoning-gym is not installed")
    ctx = Context(pool)
    opened: list[tuple[Path, int]] = []
    try:
        assert run_attack("trainer_environment", ctx).blocked
        # A checkout in a private directory (mktemp -d makes one 0700) is out of the slot uid's reach
        # whatever is bound, so the planted bug would show nothing: let others traverse what leads there.
        for top in {Path(sys.prefix), ROOT}:
            for directory in [top, *top.parents]:
                info = directory.stat()
                mode = stat.S_IMODE(info.st_mode)
                if info.st_uid == os.geteuid() and not mode & 0o001:
                    opened.append((directory, mode))
                    directory.chmod(mode | 0o005)
        planted = slot_python.SlotPython(sys.prefix, sys.executable, (), ())
        monkeypatch.setattr("agentic_grpo.sandbox.slot.slot_python", lambda packages, parent: planted)
        monkeypatch.setattr(bwrap, "interpreter_paths", lambda: [sys.base_prefix, sys.prefix, str(ROOT)])
        monkeypatch.setattr(slot_python, "trainer_paths", lambda: ())
        result = run_attack("trainer_environment", ctx)
    finally:
        ctx.close()
        for directory, mode in opened:
            directory.chmod(mode)
    assert not result.blocked and "import reasoning_gym" in result.detail, result.detail


def test_bwrap_masks_the_trainers_paths_inside_what_it_binds(tmp_path, monkeypatch):
    inside = "/usr/lib/python3/dist-packages"
    monkeypatch.setattr(slot_python, "trainer_paths", lambda: (inside, str(tmp_path.parent), "/nonexistent-elsewhere"))
    argv = bwrap.bwrap_argv(SandboxConfig(), str(tmp_path / "ws"), None, {}, ["true"])
    masks = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs" and argv[i + 1] != "/dev/pts"]
    assert masks == [inside]  # tmp_path's parent holds the workspace: left visible; the last is never bound


def test_landlock_grants_around_a_hidden_directory(tmp_path):
    tree = tmp_path / "prefix"
    (tree / "lib" / "python3.x" / "site-packages" / "generator").mkdir(parents=True)
    (tree / "lib" / "python3.x" / "json").mkdir()
    (tree / "lib" / "libpython.so").write_text("")
    (tree / "bin").mkdir()
    (tree / "lib" / "link").symlink_to(tree / "lib" / "python3.x" / "site-packages")
    stdlib = str(tree / "lib" / "python3.x")
    grants = dict(landlock.read_grants([str(tree)], [stdlib + "/site-packages"], [stdlib]))
    assert grants == {
        str(tree / "bin"): True,
        str(tree / "lib" / "libpython.so"): True,
        stdlib: False,  # listable (the interpreter lists sys.path directories), its files not readable
        stdlib + "/json": True,
    }
    assert landlock.read_grants([str(tree)], [], []) == [(str(tree), True)]


def test_a_damaged_prefix_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setattr(slot_python, "_BUILT", {})
    first = slot_python.slot_python((), str(tmp_path))
    assert Path(first.executable).resolve() == Path(slot_python.base_executable())
    home = os.path.dirname(slot_python.base_executable())
    assert (Path(first.root) / "pyvenv.cfg").read_text().startswith(f"home = {home}\n")
    (Path(first.root) / "pyvenv.cfg").unlink()  # what a temp cleaner does to old files
    monkeypatch.setattr(slot_python, "_BUILT", {})
    again = slot_python.slot_python((), str(tmp_path))
    assert again.root == first.root and (Path(again.root) / "pyvenv.cfg").is_file()
    assert slot_python.slot_python(("no_such_package_here",), str(tmp_path)).missing == ("no_such_package_here",)
