"""Releasing slots: cleanup that cannot be crashed, one failure never blocks the others, nothing of a uid carries over."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentic_grpo.sandbox import SandboxConfig, SandboxPool, bwrap
from agentic_grpo.sandbox.checks.resources import DEEP_TREE_CODE, READONLY_TREE_CODE
from agentic_grpo.sandbox.reclaim import ipc_objects
from agentic_grpo.sandbox.workspace import remove_tree
from tests.helpers import ROOT, environment, run_process, run_python

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chattr, mounts, slot uids)")


def _build_deep_tree(top: Path, depth: int = 3000) -> None:
    """The deep_tree_cleanup attack's program, run by the test on its own scratch directory."""
    cwd = os.getcwd()
    os.chdir(top)
    try:
        exec(DEEP_TREE_CODE.format(depth=depth), {})  # our own fixed program, not model output
    finally:
        os.chdir(cwd)


def test_deep_tree_breaks_rmtree_but_not_remove_tree(tmp_path, capsys):
    top = tmp_path / "ws"
    top.mkdir()
    _build_deep_tree(top)
    # The old cleanup (recursive rmtree) cannot remove it: the attack's harm is real...
    with pytest.raises((RecursionError, OSError)):
        shutil.rmtree(top)
    # ...the iterative removal can, whatever rmtree left half-done.
    remove_tree(top)
    assert not top.exists()


# Builds the readonly_tree_cleanup attack's tree in a new directory, then removes it with workspace.py alone.
_REMOVE_AS_OWNER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("workspace", sys.argv[1])
workspace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(workspace)
os.mkdir(sys.argv[2])
os.chdir(sys.argv[2])
exec(sys.argv[3], {})
os.chdir("/")
workspace.remove_tree(sys.argv[2])
"""


def test_read_only_and_unreadable_directories_are_removed_without_root():
    """Directories chmod-ed to 500 and 000 (the top one too) are made u+rwx and removed by their owner; links are
    not followed.

    Root removes them whatever their modes, so as root the tree is built and removed by uid 65534.
    """
    root = os.geteuid() == 0
    python = "/usr/bin/python3" if root else sys.executable
    if root and (not shutil.which("setpriv") or not os.access(python, os.X_OK)):
        pytest.skip("needs setpriv and a system python3 to remove the tree as a user without root")
    uid = 65534 if root else os.geteuid()
    base = Path(tempfile.mkdtemp(prefix="agentic-grpo-readonly-"))  # not tmp_path: its parents are private
    try:
        shutil.copy(ROOT / "agentic_grpo" / "sandbox" / "workspace.py", base / "workspace.py")
        outside = base / "outside"  # the links' target: owned by the remover, so following a link would change it
        outside.mkdir()
        (outside / "keep.txt").write_text("original")
        if root:
            for path in (base, outside, outside / "keep.txt"):
                os.chown(path, uid, uid)
        base.chmod(0o755)
        outside.chmod(0o555)
        top = base / "ws"
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if root else []
        code = READONLY_TREE_CODE.format(outside=str(outside))
        proc = run_process(*drop, python, "-I", "-c", _REMOVE_AS_OWNER, base / "workspace.py", top, code, cwd="/")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert not top.exists()
        assert stat.S_IMODE(outside.stat().st_mode) == 0o555 and (outside / "keep.txt").read_text() == "original"
    finally:
        remove_tree(base)


@ROOT_ONLY
def test_immutable_append_only_and_unreadable_entries_are_removed(tmp_path):
    if not shutil.which("chattr"):
        pytest.skip("no chattr")
    top = tmp_path / "ws"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("x")
    (top / "frozen").write_text("x")
    (top / "log").write_text("x")
    flagged = run_process("chattr", "+i", top / "frozen")
    run_process("chattr", "+a", top / "log")
    if flagged.returncode != 0:
        pytest.skip(f"this filesystem has no immutable flag: {flagged.stderr.strip()}")
    os.chmod(top / "a" / "b", 0)
    run_process("chattr", "+a", top / "a" / "b", check=True)  # its entries cannot be unlinked
    os.chmod(top / "a", 0)
    with pytest.raises(OSError):
        os.unlink(top / "frozen")  # the flag is really there
    remove_tree(top)
    assert not top.exists()


@ROOT_ONLY
def test_one_failed_release_never_blocks_the_others(caplog):
    pool = SandboxPool(SandboxConfig())
    slots = [pool.acquire() for _ in range(3)]
    stuck = slots[1].workspace
    # Stack a read-only bind mount on one workspace: its removal must fail (EBUSY), loudly, alone.
    run_process("mount", "--bind", "-o", "ro", "/usr/share", stuck, check=True)
    try:
        with caplog.at_level(logging.ERROR):
            pool.release(slots[1])  # must not raise
        assert pool.release_failures == 1
        assert any("releasing slot" in r.getMessage() for r in caplog.records)
        pool.close()  # the other two: released whatever happened to the stuck one
        assert not slots[0].workspace.exists() and not slots[2].workspace.exists()
        assert all(s.closed for s in slots) and pool.live_slots == 0
    finally:
        run_process("umount", "-l", stuck)
        run_process("umount", "-l", stuck)
        remove_tree(stuck)
        if pool.root.exists():
            remove_tree(pool.root)


@ROOT_ONLY
@pytest.mark.integration
def test_release_removes_the_slot_uids_ipc_objects():
    """Defence in depth behind seccomp: IPC objects a slot uid owns are removed at release."""
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK) or not shutil.which("setpriv"):
        pytest.skip("needs a system python3 and setpriv")
    pool = SandboxPool(SandboxConfig())
    slot = pool.acquire()
    try:
        program = "import ctypes; l = ctypes.CDLL(None); print(l.shmget(0, 4096, 0o1000 | 0o600), l.msgget(0, 0o1000 | 0o600))"
        made = run_process("setpriv", f"--reuid={slot.uid}", f"--regid={slot.uid}", "--clear-groups", "--", python,
                           "-I", "-c", program, cwd="/", check=True)  # fmt: skip
        assert all(int(x) >= 0 for x in made.stdout.split()), made
        assert set(ipc_objects(slot.uid)) == {"shm", "msg"}
        uid = slot.uid
    finally:
        pool.release(slot)
        pool.close()
    assert ipc_objects(uid) == {}


@ROOT_ONLY
def test_cgroup_and_workspace_quota_live_and_die_with_the_slot():
    config = SandboxConfig(memory_mb=300, max_processes=40, cpu_cores=0.5, workspace_mb=20, workspace_inodes=100)
    pool = SandboxPool(config)
    try:
        if pool.cgroups.version is None:
            pytest.skip(f"no writable cgroup hierarchy: {pool.cgroups.reason}")
        slot = pool.acquire()
        group_dirs = list(slot.cgroup.dirs)
        values = {f.name: f.read_text().strip() for d in group_dirs for f in d.iterdir()
                  if f.name in ("memory.max", "memory.limit_in_bytes", "pids.max", "cpu.max", "cpu.cfs_quota_us")}  # fmt: skip
        assert values.get("memory.max", values.get("memory.limit_in_bytes")) == str(300 << 20)
        assert values["pids.max"] == "40"
        assert values.get("cpu.max", values.get("cpu.cfs_quota_us")).split()[0] == "50000"
        # The pool's parent weighs one process per live slot: all slots together are not one process's share.
        parent = pool.cgroups.parents.get("cpu", pool.cgroups.parents.get("unified"))
        weight = (parent / "cpu.shares") if (parent / "cpu.shares").exists() else (parent / "cpu.weight")
        others = [pool.acquire() for _ in range(2)]
        assert int(weight.read_text()) in (1024 * 3, 100 * 3)
        for other in others:
            pool.release(other)
        assert int(weight.read_text()) in (1024, 100)
        # The command runs inside the group, and the workspace is a 20 MB tmpfs.
        out = slot.run(["sh", "-c", "df -k . | tail -1"]).stdout.split()
        assert out[0] == "tmpfs" and int(out[1]) == 20 * 1024
        workspace = slot.workspace
        slot.run(["sh", "-c", "sleep 600 & sleep 600 & true"])  # nothing may outlive the call in the group
        pool.release(slot)
        assert not workspace.exists()
        # An empty group is kept for the next slot, with nothing of this one left in it.
        assert all(d.exists() and not (d / "cgroup.procs").read_text().split() for d in group_dirs)
        again = pool.acquire()
        assert again.cgroup.dirs == group_dirs
        pool.release(again)
        assert str(workspace) not in Path("/proc/self/mounts").read_text()
    finally:
        pool.close()
    assert not any(d.exists() for d in group_dirs)
    assert not any(p.exists() for p in pool.cgroups.parents.values())


@pytest.mark.integration
def test_launcher_refuses_when_landlock_enforces_less_than_reported():
    spec = {"cwd": tempfile.gettempdir(), "env": {"PATH": bwrap.SAFE_PATH}, "rlimits": {},
            "landlock": {"read": ["/usr"], "write": [], "devices": [], "require": ["filesystem", "no_such_feature"]}}  # fmt: skip
    proc = run_python("-I", "-S", bwrap.LAUNCHER, json.dumps(spec), "true")
    assert proc.returncode == 127
    assert "does not enforce ['no_such_feature']" in proc.stderr


def test_memfd_is_refused_without_a_memory_cgroup_and_allowed_with_one():
    code = "import os; os.memfd_create('x'); print('MEMFD')"
    without = SandboxPool(SandboxConfig(use_cgroup=False))
    try:
        with without.acquire() as slot:
            assert "MEMFD" not in slot.run_python(code).stdout
        assert "memfd_create refused" in without.report.bounds["memory"]
    finally:
        without.close()
    with_group = SandboxPool(SandboxConfig())
    try:
        if "memory" not in with_group.cgroups.bounded:
            pytest.skip("no memory cgroup here")
        with with_group.acquire() as slot:
            assert "MEMFD" in slot.run_python(code).stdout  # charged to the slot's group instead
    finally:
        with_group.close()


@ROOT_ONLY
@pytest.mark.integration
def test_a_killed_trainers_mounts_groups_and_workspaces_are_reclaimed_by_the_next_pool():
    code = (
        "import os, sys, time\nfrom agentic_grpo.sandbox import SandboxConfig, SandboxPool\n"
        "pool = SandboxPool(SandboxConfig())\nslot = pool.acquire()\n"
        "print(slot.workspace, *(slot.cgroup.dirs if slot.cgroup else []), flush=True)\ntime.sleep(600)\n"
    )
    trainer = subprocess.Popen(  # read while it runs, then killed: not `run_process`
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=environment()
    )
    try:
        paths = [Path(p) for p in trainer.stdout.readline().split()]
    finally:
        trainer.kill()  # SIGKILL: no close(), no release()
        trainer.wait()
    workspace, groups = paths[0], paths[1:]
    assert workspace.exists() and str(workspace) in Path("/proc/self/mounts").read_text()
    SandboxPool(SandboxConfig()).close()  # the next trainer's pool cleans up after the dead one
    assert not workspace.parent.exists() and str(workspace) not in Path("/proc/self/mounts").read_text()
    assert not any(g.exists() or g.parent.exists() for g in groups)
