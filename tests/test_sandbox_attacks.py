"""The attack suite (agentic_grpo/sandbox/checks/) against every layer this host offers.

Same attacks as `agentic-grpo sandbox check`: in this process (bubblewrap, and Landlock
when the trainer's interpreter is reachable by slot uids), as root with the system python
(so Landlock runs as root even when the venv lives under a private /root), as an
unprivileged user (setpriv to nobody), and with user namespaces denied by a seccomp filter
(as Docker's default profile does) to show `auto` then refuses Landlock without root and names the fixes.
unsafe-local is run too, to prove the checks can see harm.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import textwrap
from pathlib import Path

import pytest

from agentic_grpo.sandbox import SandboxConfig, SandboxPool
from agentic_grpo.sandbox.checks import ATTACKS, Context, run_attack
from agentic_grpo.sandbox.probe import probe
from tests.helpers import ROOT, run_process, run_python

NAMES = list(ATTACKS)
# What an unprivileged trainer cannot bound (no cgroup delegated to it, no tmpfs mount): the
# pool's report says NOT bounded, and the attacks must report exactly these as documented gaps.
NONROOT_GAPS = {"disk_quota", "cpu_share", "disk_bandwidth"}
# What Landlock does not mediate on any user: `stat` of host paths (the report says so).
LANDLOCK_GAPS = {"stat_outside"}


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
    if result.skipped:
        pytest.skip(f"{name} cannot be tried here: {result.skipped}")
    documented = attack_context.pool.layer == "landlock" and name in LANDLOCK_GAPS and result.gap
    assert result.blocked or documented, f"{attack_context.pool.layer}: {name} did harm: {result.detail}"


def test_auto_picks_bubblewrap_when_installed():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed (.ci/install_sandbox.sh)")
    report = probe(SandboxConfig())
    assert report.layer == "bwrap" and report.downgraded is None


def _vsock_available() -> bool:
    try:
        socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
        return True
    except (OSError, AttributeError):
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="running the unsafe layer's attacks is only contained as root here")
@pytest.mark.integration
def test_checks_detect_harm_without_isolation():
    """unsafe-local isolates nothing: the attacks must be reported as harm (the checks can fail).

    Small limits and no cgroup or quota keep the proof cheap: memfd holds 384 MB, the disk 64 MB.
    """
    config = SandboxConfig(mode="unsafe-local", memory_mb=256, workspace_mb=0, workspace_inodes=256, use_cgroup=False)
    pool = SandboxPool(config)
    ctx = Context(pool)
    try:
        harmful = ["network_loopback", "write_outside", "read_sibling", "read_opt_data", "keyring_session",
                   "keyring_user_carryover", "sysv_ipc", "unix_socket_by_path", "unix_socket_types",
                   "unix_abstract_squat", "namespaces_and_uring",
                   "memfd_memory", "disk_quota", "cpu_share", "other_process_priority", "xattr_carryover",
                   "metadata_outside", "ptrace_init", "kernel_buffer_memory", "host_uevents",
                   "inotify_shared_files", "trainer_environment", "lock_side_channel", "host_proc_files",
                   "stat_outside", "disk_bandwidth", "page_cache_probe"]  # fmt: skip
        if _vsock_available():
            harmful.append("vsock_port_space")
        results = {name: run_attack(name, ctx) for name in harmful}
        assert not [n for n, r in results.items() if r.blocked and not r.skipped], {
            n: r.detail for n, r in results.items()
        }
        # Unbounded resources on a pool that says so are documented gaps, not silent passes.
        assert {n for n, r in results.items() if r.gap} == {"disk_quota", "cpu_share", "disk_bandwidth"}
        # ...while the limits, tree-killing and cleanup the host side provides still hold.
        for name in ("setsid_grandchild_timeout", "output_flood", "deep_tree_cleanup", "readonly_tree_cleanup"):
            assert run_attack(name, ctx).blocked, name
    finally:
        ctx.close()
        pool.close()


# Run by the system python (reachable by every uid); imports the sandbox package without
# agentic_grpo/__init__.py (which needs the venv's transformers).
_SCRIPT = textwrap.dedent(
    """
    import io, json, os, sys, types
    pkg = types.ModuleType("agentic_grpo")
    pkg.__path__ = [sys.argv[1] + "/agentic_grpo"]
    sys.modules["agentic_grpo"] = pkg
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool
    from agentic_grpo.sandbox.probe import probe
    from agentic_grpo.sandbox import seccomp
    from agentic_grpo.sandbox.checks import run_all

    quick = "quick" in sys.argv  # probe and pool only, no attacks
    modes = [m for m in sys.argv[2:] if m != "quick"]
    if modes == ["no-userns"]:
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
    elif modes == ["broken-bwrap"]:
        # A bwrap that exists and fails, first on PATH: `auto` must say it fell back.
        fake = os.path.join(sys.argv[1], "fakebin")
        os.makedirs(fake, exist_ok=True)
        with open(os.path.join(fake, "bwrap"), "w") as f:
            f.write("#!/bin/sh\\necho 'bwrap: broken on purpose' >&2\\nexit 1\\n")
        os.chmod(os.path.join(fake, "bwrap"), 0o755)
        os.environ["PATH"] = fake + ":" + os.environ["PATH"]
        modes = ["auto"]
    out = {}
    for mode in modes:
        config = SandboxConfig(mode=mode)
        report = probe(config, refresh=True)
        try:
            pool = SandboxPool(config)
        except RuntimeError as exc:  # SandboxUnavailable: no layer this mode may use works
            out[mode] = {"layer": None, "probe": report.layers, "error": str(exc)}
            continue
        attacks = [] if quick else [r.to_dict() for r in run_all(pool)]
        out[mode] = {"layer": pool.layer, "probe": report.layers, "downgraded": report.downgraded,
                     "bounds": pool.report.bounds, "metrics": pool.metrics(), "attacks": attacks}
        pool.close()
    print(json.dumps(out))
    """
)


def _as_user(uid: int, *args: str) -> tuple[dict, str]:
    """Run _SCRIPT with the system python as `uid` (0: root); its JSON and its stderr."""
    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access(python, os.X_OK):
        pytest.skip("needs root, setpriv and a system python3 to run as another user")
    # Not pytest's tmp_path: its parents are private to root.
    directory = Path(tempfile.mkdtemp(prefix="agentic-grpo-asuser-"))
    directory.chmod(0o755)
    script = directory / "asuser.py"
    script.write_text(_SCRIPT)
    # A copy of the sandbox package any user can read, wherever the checkout lives
    # (a clone under a private directory, e.g. mktemp's 0700, is unreadable to uid 65534).
    package = directory / "agentic_grpo" / "sandbox"
    shutil.copytree(ROOT / "agentic_grpo" / "sandbox", package, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [script, directory / "agentic_grpo", *package.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    if uid:
        fakebin = directory / "fakebin"
        fakebin.mkdir(mode=0o755)
        os.chown(fakebin, uid, uid)
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid else []
    try:
        proc = run_process(*drop, python, "-I", script, directory, *args, cwd="/", env={"PATH": "/usr/bin:/bin"})
    finally:
        shutil.rmtree(directory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def _harm(out: dict) -> tuple[list, list]:
    """(undocumented harm, documented gaps) as (mode, attack, detail) rows."""
    rows = [
        (mode, a["name"], a["detail"], a["gap"]) for mode, v in out.items() for a in v["attacks"] if not a["blocked"]
    ]
    return [r[:3] for r in rows if not r[3]], [r[:2] for r in rows if r[3]]


@pytest.mark.integration
def test_attack_suite_as_root_with_system_python():
    """Landlock as root, with slot uids and no capability: possible with an interpreter every uid can reach."""
    out, _ = _as_user(0, "landlock")  # bwrap as root runs in this process already
    assert out["landlock"]["layer"] == "landlock"
    harmed, gaps = _harm(out)
    assert not harmed and {name for _, name in gaps} <= LANDLOCK_GAPS
    assert {a["name"] for a in out["landlock"]["attacks"]} == set(NAMES)


@pytest.mark.integration
def test_attack_suite_as_unprivileged_user():
    out, _ = _as_user(65534, "bwrap", "landlock")
    assert out["bwrap"]["layer"] == "bwrap"  # unprivileged bubblewrap (user namespace)
    assert out["landlock"]["layer"] == "landlock"
    harmed, gaps = _harm(out)
    assert not harmed
    # No cgroup and no tmpfs without root: those attacks do harm, and the report says so.
    assert {name for mode, name in gaps if mode == "bwrap"} <= NONROOT_GAPS
    assert {name for mode, name in gaps if mode == "landlock"} <= NONROOT_GAPS | LANDLOCK_GAPS
    for mode in out:
        assert all("NOT bounded" in out[mode]["bounds"][k] for k in ("disk", "cpu", "disk I/O"))
        assert "memfd_create refused" in out[mode]["bounds"]["memory"]
    assert {a["name"] for a in out["bwrap"]["attacks"]} == set(NAMES)
    assert {a["name"] for a in out["landlock"]["attacks"]} == set(NAMES)


@pytest.mark.integration
def test_auto_refuses_landlock_without_root_and_names_the_fixes():
    """Without user namespaces and without root, `auto` refuses (Landlock slots would share the trainer's uid);
    naming the layer still gets it."""
    if not _layer_available("landlock") and probe(SandboxConfig(mode="landlock")).landlock_abi < 6:
        pytest.skip("no usable Landlock on this kernel")
    out, _ = _as_user(65534, "no-userns")
    auto = out["auto"]
    assert auto["layer"] is None and auto["probe"]["bwrap"] != "ok"
    assert auto["probe"]["landlock"].startswith("refused by auto: without root")
    for fix in ("user namespaces", "run the trainer as root", "`sandbox: landlock`"):
        assert fix in auto["error"], fix


@pytest.mark.integration
def test_broken_bwrap_on_path_is_a_loud_downgrade():
    """As root, a broken bwrap makes `auto` fall back to Landlock with slot uids, and say so."""
    out, stderr = _as_user(0, "broken-bwrap", "quick")
    auto = out["auto"]
    assert "broken on purpose" in auto["probe"]["bwrap"] and auto["layer"] == "landlock"
    assert "fell back to the weaker landlock layer" in auto["downgraded"]
    assert "WARNING: sandbox: auto fell back" in stderr
    assert auto["metrics"]["sandbox/downgraded"] == 1.0


@pytest.mark.integration
def test_sandbox_check_cli_exits_zero():
    code = "import sys; from agentic_grpo.sandbox.cli import main; raise SystemExit(main(sys.argv[1:]))"
    proc = run_python("-c", code, "sandbox", "check", "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["probe"]["layer"] in ("bwrap", "landlock")
    assert report["probe"]["bounds"] and report["probe"]["cgroup"]
    assert len(report["attacks"]) == len(NAMES)
    assert all(a["blocked"] or a["gap"] for a in report["attacks"])
