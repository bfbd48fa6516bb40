"""The attack suite (agentic_grpo/sandbox/attacks.py) against every layer this host offers.

Same attacks as `agentic-grpo sandbox check`: as the current user for the bubblewrap and
Landlock layers, as an unprivileged user (setpriv to nobody), and with user namespaces
denied by a seccomp filter (as Docker's default profile does) to show the probe falls
back to Landlock. unsafe-local is run too, to prove the checks can see harm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from agentic_grpo.sandbox import SandboxConfig, SandboxPool, probe
from agentic_grpo.sandbox.attacks import ATTACKS, Context, run_attack

ROOT = Path(__file__).resolve().parents[1]
NAMES = list(ATTACKS)


def _layer_available(mode: str) -> bool:
    return probe(SandboxConfig(mode=mode)).layer == mode


@pytest.fixture(scope="module", params=["bwrap", "landlock"])
def attack_context(request):
    if not _layer_available(request.param):
        pytest.skip(f"layer {request.param} does not work here: {probe(SandboxConfig(mode=request.param)).layers}")
    pool = SandboxPool(SandboxConfig(mode=request.param, max_processes=64))
    ctx = Context(pool)
    yield ctx
    ctx.close()
    pool.close()


@pytest.mark.parametrize("name", NAMES)
def test_attack_is_blocked(attack_context, name):
    result = run_attack(name, attack_context)
    assert result.blocked, f"{attack_context.pool.layer}: {name} did harm: {result.detail}"


def test_auto_picks_bubblewrap_when_installed():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed (.ci/install_sandbox.sh)")
    assert probe(SandboxConfig()).layer == "bwrap"


@pytest.mark.skipif(os.geteuid() != 0, reason="running the unsafe layer's attacks is only contained as root here")
def test_checks_detect_harm_without_isolation():
    """unsafe-local isolates nothing: the harmless attacks must be reported as harm (the checks can fail)."""
    pool = SandboxPool(SandboxConfig(mode="unsafe-local"))
    ctx = Context(pool)
    try:
        for name in ("network_loopback", "write_outside", "read_sibling"):
            assert not run_attack(name, ctx).blocked, name
        # ...while the limits and tree-killing the launcher provides still hold.
        for name in ("setsid_grandchild_timeout", "output_flood"):
            assert run_attack(name, ctx).blocked, name
    finally:
        ctx.close()
        pool.close()


# Run by a python the unprivileged user can execute; imports the sandbox package without
# agentic_grpo/__init__.py (which needs the venv's transformers).
_NONROOT_SCRIPT = textwrap.dedent(
    """
    import json, sys, types
    pkg = types.ModuleType("agentic_grpo")
    pkg.__path__ = [sys.argv[1] + "/agentic_grpo"]
    sys.modules["agentic_grpo"] = pkg
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool, probe
    from agentic_grpo.sandbox import seccomp
    from agentic_grpo.sandbox.attacks import run_all

    if sys.argv[2] == "no-userns":
        # Deny user namespaces the way container runtimes do: clone/unshare with CLONE_NEWUSER, and clone3.
        ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
        arch, nr_clone, nr_unshare, nr_clone3 = {"x86_64": (0xC000003E, 56, 272, 435),
                                                 "aarch64": (0xC00000B7, 220, 97, 435)}[seccomp.machine()]
        prog = [(ld, 4, 0, 0), (jeq, arch, 0, "allow"), (ld, 0, 0, 0), (jeq, nr_clone3, "enosys", 0),
                (jeq, nr_clone, "flags", 0), (jeq, nr_unshare, "flags", "allow"),
                ("label", "flags"), (ld, 16, 0, 0), (jset, 0x10000000, "eperm", "allow"),
                ("label", "enosys"), (ret, 0x00050000 | 38, 0, 0),
                ("label", "eperm"), (ret, 0x00050000 | 1, 0, 0),
                ("label", "allow"), (ret, 0x7FFF0000, 0, 0)]
        seccomp.install(seccomp.assemble(prog))
        modes = ["auto"]
    else:
        modes = sys.argv[2:]
    out = {}
    for mode in modes:
        config = SandboxConfig(mode=mode)
        report = probe(config)
        pool = SandboxPool(config)
        out[mode] = {"layer": pool.layer, "probe": report.layers, "attacks": [r.to_dict() for r in run_all(pool)]}
        pool.close()
    print(json.dumps(out))
    """
)


def _as_nobody(*args: str) -> dict:
    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access(python, os.X_OK):
        pytest.skip("needs root, setpriv and a system python3 to run as an unprivileged user")
    # Not pytest's tmp_path: its parents are private to root.
    directory = Path(tempfile.mkdtemp(prefix="agentic-grpo-nonroot-"))
    directory.chmod(0o755)
    script = directory / "nonroot.py"
    script.write_text(_NONROOT_SCRIPT)
    script.chmod(0o644)
    # A copy of the sandbox package the unprivileged user can read, wherever the checkout lives
    # (a clone under a private directory, e.g. mktemp's 0700, is unreadable to uid 65534).
    package = directory / "agentic_grpo" / "sandbox"
    shutil.copytree(ROOT / "agentic_grpo" / "sandbox", package, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [directory / "agentic_grpo", *package.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        return _run_as_nobody(python, script, directory, args)
    finally:
        shutil.rmtree(directory)


def _run_as_nobody(python: str, script: Path, root: Path, args: tuple[str, ...]) -> dict:
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            python,
            "-I",
            str(script),
            str(root),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_attack_suite_as_unprivileged_user():
    out = _as_nobody("bwrap", "landlock")
    assert out["bwrap"]["layer"] == "bwrap"  # unprivileged bubblewrap (user namespace)
    assert out["landlock"]["layer"] == "landlock"
    harmed = [(mode, a["name"], a["detail"]) for mode, v in out.items() for a in v["attacks"] if not a["blocked"]]
    assert not harmed
    assert {a["name"] for a in out["bwrap"]["attacks"]} == set(NAMES)


def test_falls_back_to_landlock_without_user_namespaces():
    if not _layer_available("landlock"):
        pytest.skip("no Landlock on this kernel")
    out = _as_nobody("no-userns")["auto"]
    assert out["probe"]["bwrap"] != "ok"
    assert out["layer"] == "landlock"
    assert all(a["blocked"] for a in out["attacks"]), out["attacks"]


def test_sandbox_check_cli_exits_zero():
    code = "import sys; from agentic_grpo.sandbox.cli import main; raise SystemExit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, "sandbox", "check", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["probe"]["layer"] in ("bwrap", "landlock")
    assert len(report["attacks"]) == len(NAMES) and all(a["blocked"] for a in report["attacks"])
