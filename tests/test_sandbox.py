"""The sandbox API the tools and the rollout manager use: slots, limits, results, the pool, the CLI."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentic_grpo.sandbox import ExecResult, SandboxConfig, SandboxPool, SandboxUnavailable
from agentic_grpo.sandbox.cli import add_sandbox_parser
from agentic_grpo.sandbox.probe import probe

probe_mod = importlib.import_module("agentic_grpo.sandbox.probe")  # the package exports the function `probe`


@pytest.fixture(scope="module")
def pool():
    pool = SandboxPool(SandboxConfig(timeout_s=10))
    yield pool
    pool.close()


def test_run_python_output_exit_code_and_cwd(pool):
    with pool.acquire() as slot:
        result = slot.run_python("import os, sys; print(os.getcwd()); print('err', file=sys.stderr); sys.exit(3)")
        assert isinstance(result, ExecResult)
        assert result.stdout.strip() == str(slot.workspace)
        assert result.stderr.strip() == "err"
        assert result.exit_code == 3 and not result.timed_out and not result.truncated
        assert set(result.to_dict()) == {"stdout", "stderr", "exit_code", "timed_out", "truncated", "seconds"}


def test_environment_is_clean(pool, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-trainer-secret")
    with pool.acquire() as slot:
        result = slot.run_python("import os; print(sorted(os.environ.items()))")
    assert "sk-fake-trainer-secret" not in result.stdout
    assert "OPENAI_API_KEY" not in result.stdout


def test_stdin_and_run(pool):
    with pool.acquire() as slot:
        assert slot.run(["cat"], stdin="hello\n").stdout == "hello\n"
        assert slot.run_python("print(input()[::-1])", stdin=b"abc\n").stdout == "cba\n"
        assert slot.run_python("import os; os.kill(os.getpid(), 9)").exit_code == 128 + 9
        missing = slot.run(["no-such-command-xyz"])
        assert missing.exit_code not in (0, None)


def test_workspace_persists_within_slot_and_is_removed_on_release(pool):
    slot = pool.acquire()
    assert slot.run_python("open('state.txt', 'w').write('42')").exit_code == 0
    assert slot.run_python("print(open('state.txt').read())").stdout.strip() == "42"
    assert (slot.workspace / "state.txt").read_text() == "42"
    workspace = slot.workspace
    pool.release(slot)
    assert not workspace.exists()
    with pytest.raises(RuntimeError):
        slot.run(["true"])


def test_fresh_workspace_per_slot(pool):
    a, b = pool.acquire(), pool.acquire()
    try:
        assert a.workspace != b.workspace
        assert list(a.workspace.iterdir()) == [] and list(b.workspace.iterdir()) == []
        if os.geteuid() == 0:
            assert a.uid is not None and a.uid != b.uid
    finally:
        pool.release(a)
        pool.release(b)


def test_timeout_and_overrides(pool):
    with pool.acquire() as slot:
        slow = slot.run_python("import time; time.sleep(60)", timeout=0.5)
        assert slow.timed_out and slow.exit_code is None
        big = slot.run_python("x = bytearray(300 * 1024 * 1024); print('ok')", memory_mb=150)
        assert "MemoryError" in big.stderr and "ok" not in big.stdout
        capped = slot.run_python("print('y' * 5000)", max_output_bytes=100)
        assert capped.truncated and capped.stdout == "y" * 100


def test_file_size_limit():
    pool = SandboxPool(SandboxConfig(max_file_mb=1))
    try:
        with pool.acquire() as slot:
            result = slot.run_python("open('big', 'wb').write(b'x' * (3 << 20))")
            assert result.exit_code != 0
            assert (slot.workspace / "big").stat().st_size <= 1 << 20
    finally:
        pool.close()


def test_large_code_goes_through_a_file(pool):
    code = "x = 0\n" + "x += 1\n" * 30_000 + "print(x)\n"
    with pool.acquire() as slot:
        assert slot.run_python(code).stdout.strip() == "30000"


def test_code_that_takes_locks_runs_in_a_slot(pool):
    """Locks are no-ops in slots (a lock on a file every slot reads would be a channel between them), so code
    that locks must still work: sqlite in the workspace, a blocking flock as `filelock` takes it, lockf."""
    code = """
import fcntl, json, os, sqlite3
db = sqlite3.connect("t.db")
db.execute("create table t (x)")
db.executemany("insert into t values (?)", [(i,) for i in range(5)])
db.commit()
with open("lock", "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    fcntl.lockf(f, fcntl.LOCK_EX)
    fcntl.flock(f, fcntl.LOCK_UN)
print(json.dumps(db.execute("select sum(x) from t").fetchone()))
"""
    with pool.acquire() as slot:
        result = slot.run_python(code, timeout=10)
    assert result.exit_code == 0 and not result.timed_out, result.stderr
    assert result.stdout.strip() == "[10]"


def test_concurrent_runs_from_many_threads(pool):
    def one(i: int) -> tuple[int, str]:
        slot = pool.acquire()
        try:
            return i, slot.run_python(f"print({i} * 2)").stdout.strip()
        finally:
            pool.release(slot)

    with ThreadPoolExecutor(max_workers=12) as ex:
        results = list(ex.map(one, range(24)))
    assert all(out == str(i * 2) for i, out in results)
    assert pool.live_slots == 0


def test_unsafe_local_warns(caplog):
    with caplog.at_level(logging.WARNING):
        pool = SandboxPool(SandboxConfig(mode="unsafe-local"))
    try:
        assert pool.layer == "unsafe-local"
        assert any("WITHOUT isolation" in r.getMessage() for r in caplog.records)
    finally:
        pool.close()


def test_unavailable_says_what_to_install(monkeypatch):
    monkeypatch.setattr(probe_mod, "_CACHE", {})
    monkeypatch.setattr(probe_mod.landlock, "abi_version", lambda: 0)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        SandboxPool(SandboxConfig(mode="landlock"))


def test_probe_reports_what_protections_rest_on(pool):
    report = probe(SandboxConfig())
    assert report.layer in ("bwrap", "landlock")
    for key in ("filesystem", "network", "kernel", "timeout"):
        assert report.protections[key]
    assert report.layer in report.format()
    # The pool adds what bounds its slots' resources, and says NOT bounded where nothing does.
    for key in ("memory", "processes", "cpu", "disk"):
        assert pool.report.bounds[key]
    assert pool.report.cgroup and "resource bounds per slot" in pool.report.format()


def test_probe_result_is_cached_on_disk_per_host_state(monkeypatch, tmp_path):
    fresh = probe(SandboxConfig(), refresh=True)
    assert not fresh.cached and fresh.layer
    monkeypatch.setattr(probe_mod, "_CACHE", {})  # as a new process would start
    again = probe(SandboxConfig())
    assert again.cached and again.layer == fresh.layer and again.layers == fresh.layers
    # Another input of the answer (here a read-only path never used before) is another key: probed for real.
    other = probe(SandboxConfig(extra_ro_paths=[str(tmp_path)]))
    assert not other.cached and other.layer == fresh.layer
    # A cache file others could have written is ignored.
    cache = probe_mod.private_dir() / "probe-cache.json"
    cache.chmod(0o666)
    try:
        monkeypatch.setattr(probe_mod, "_CACHE", {})
        assert not probe(SandboxConfig()).cached
    finally:
        cache.chmod(0o600)


def test_landlock_features_are_reported():
    report = probe(SandboxConfig(mode="landlock"))
    if report.landlock_abi < 1:
        pytest.skip("no Landlock here")
    assert report.landlock_features["filesystem"]
    assert f"landlock ABI {report.landlock_abi}" in report.format()


def test_bad_mode_rejected():
    with pytest.raises(ValueError):
        SandboxConfig(mode="docker")


def test_cli_exec_prints_json(capsys):
    parser = argparse.ArgumentParser()
    add_sandbox_parser(parser.add_subparsers())
    args = parser.parse_args(["sandbox", "exec", "--timeout", "5", "--max-output", "3", "--", "echo", "hello"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stdout"] == "hel" and out["truncated"] and out["exit_code"] == 0 and not out["timed_out"]
    assert out["layer"] in ("bwrap", "landlock") and "downgraded" in out


def test_python_interpreter_tool_runs_in_a_slot(pool):
    from agentic_grpo.tools.python import PythonInterpreter

    with pool.acquire() as slot:
        tool = PythonInterpreter()
        tool.sandbox, tool.workspace = slot, slot.workspace
        assert tool.python("import os; print(os.getcwd())").output == str(slot.workspace)


@pytest.mark.integration
def test_cli_file_fast_path_skips_the_package_init():
    """`python .../sandbox/cli.py sandbox exec` runs without importing agentic_grpo/__init__ (transformers)."""
    from tests.helpers import run_python

    cli = os.path.join(os.path.dirname(probe_mod.__file__), "cli.py")
    code = (
        "import runpy, sys; sys.argv = [sys.argv[1], 'sandbox', 'exec', '--', 'echo', 'fast'];"
        "\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as e:\n"
        "    print('TRANSFORMERS' if 'transformers' in sys.modules else 'LIGHT', e.code, file=sys.stderr)"
    )
    proc = run_python("-I", "-c", code, cli, timeout=120)
    assert json.loads(proc.stdout)["stdout"] == "fast\n"
    assert proc.stderr.strip().endswith("LIGHT 0"), proc.stderr[-2000:]


def test_two_pools_of_one_rank_in_one_process_each_bound_their_slots():
    """A trainer's pool and an evaluation's pool in one process: the second used to find its cgroup name taken
    ("File exists") and ran its slots with no memory, process or CPU bound."""
    pools = [SandboxPool(SandboxConfig()) for _ in range(2)]
    try:
        if pools[0].cgroups.version is None:
            pytest.skip(f"no writable cgroup hierarchy here: {pools[0].cgroups.reason}")
        assert [p.metrics()["sandbox/cgroup"] for p in pools] == [1.0, 1.0]
        slots = [p.acquire() for p in pools]
        assert all(s.cgroup is not None for s in slots)
        for pool, slot in zip(pools, slots, strict=True):
            pool.release(slot)
    finally:
        for pool in pools:
            pool.close()


def test_a_user_namespace_setting_is_part_of_the_probe_cache_key(monkeypatch):
    from agentic_grpo.sandbox import probe_cache

    before = probe_cache.key("auto", [], 0, True)
    real = probe_cache._read_setting
    monkeypatch.setattr(probe_cache, "_read_setting",
                        lambda path: "0" if path.endswith("max_user_namespaces") else real(path))  # fmt: skip
    assert probe_cache.key("auto", [], 0, True) != before  # userns switched off: probed again, not read from disk


def test_landlock_as_root_with_a_private_interpreter_is_refused_with_the_fix():
    import sys
    from pathlib import Path

    private = [p for p in Path(sys.executable).resolve().parents if p.exists() and not p.stat().st_mode & 0o001]
    if os.geteuid() != 0 or not private:
        pytest.skip("applies to a root trainer whose interpreter lies under a directory others cannot search")
    report = probe(SandboxConfig(mode="landlock"), refresh=True)
    assert report.layer is None or report.layer != "landlock"
    assert "chmod o+x" in report.layers["landlock"] and "refused" in report.layers["landlock"]


def test_recipe_fields_set_every_sandbox_bound():
    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.run_parts import build_rollout_parts

    config = AgenticGRPOConfig(output_dir="/tmp/unused", environment="agentic_grpo.tools.python:PythonInterpreter",
                               tool_timeout=3, sandbox={"memory_mb": 512, "workspace_mb": 64, "workspace_inodes": 99,
                                                        "cpu_cores": 0.5, "max_processes": 8})  # fmt: skip
    sandbox = build_rollout_parts(config).sandbox
    assert (sandbox.timeout_s, sandbox.memory_mb, sandbox.workspace_mb, sandbox.workspace_inodes, sandbox.cpu_cores,
            sandbox.max_processes) == (3, 512, 64, 99, 0.5, 8)  # fmt: skip


def test_the_sandbox_setting_takes_a_mode_or_a_mapping_and_names_a_misspelled_limit():
    from agentic_grpo.config import AgenticGRPOConfig

    assert AgenticGRPOConfig(output_dir="/tmp/unused", sandbox="bwrap").sandbox == {"mode": "bwrap"}
    on_the_command_line = AgenticGRPOConfig(output_dir="/tmp/unused", sandbox="{mode: landlock, memory_mb: 64}")
    assert on_the_command_line.sandbox == {"mode": "landlock", "memory_mb": 64}
    with pytest.raises(ValueError, match="key `memory` is not known; did you mean `memory_mb`"):
        AgenticGRPOConfig(output_dir="/tmp/unused", sandbox={"memory": 64})
    with pytest.raises(ValueError, match="sandbox `mode` must be one of"):
        AgenticGRPOConfig(output_dir="/tmp/unused", sandbox="docker")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"memory_mb": "lots"}, "sandbox `memory_mb` must be a whole number, got 'lots'"),
        ({"memory_mb": -5}, "sandbox `memory_mb` must be above 0, got -5"),
        ({"cpu_cores": "two"}, "sandbox `cpu_cores` must be a number, got 'two'"),
        ({"use_cgroup": "yes"}, "sandbox `use_cgroup` must be true or false, got 'yes'"),
        ({"workspace_mb": -1}, "sandbox `workspace_mb` must be 0 (no cap) or above, got -1"),
        ({"extra_ro_paths": "/data"}, "sandbox `extra_ro_paths` must be a list of paths, got '/data'"),
        ({"timeout_s": 3}, "the sandbox's time limit is the recipe's `tool_timeout`"),
    ],
)
def test_a_bad_sandbox_value_is_refused_naming_its_field(setting, message):
    from agentic_grpo.config import AgenticGRPOConfig

    with pytest.raises(ValueError, match=re.escape(message)):
        AgenticGRPOConfig(output_dir="/tmp/unused", sandbox=setting)


def test_every_sandbox_field_but_its_timeout_can_be_set_from_a_recipe():
    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.run_parts import build_rollout_parts

    setting = {"extra_ro_paths": ["/srv/data"], "max_output_bytes": 4096, "max_file_mb": 8, "max_open_files": 64}
    config = AgenticGRPOConfig(output_dir="/tmp/unused", environment="agentic_grpo.tools.python:PythonInterpreter",
                               sandbox=setting)  # fmt: skip
    sandbox = build_rollout_parts(config).sandbox
    assert (sandbox.extra_ro_paths, sandbox.max_output_bytes, sandbox.max_file_mb, sandbox.max_open_files) == (
        ["/srv/data"], 4096, 8, 64)  # fmt: skip


def test_slots_see_of_opt_only_the_interpreter_files_that_live_there(monkeypatch, tmp_path):
    """/opt holds training data (/opt/ml/input/data) and other installs: neither layer grants it, only what an
    /opt/conda-like base interpreter needs (its binary and its `lib`), never the whole prefix."""
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from agentic_grpo.sandbox import bwrap

    try:
        conda = Path(tempfile.mkdtemp(prefix="agentic-grpo-conda-", dir="/opt"))
    except OSError as exc:
        pytest.skip(f"cannot make a stand-in interpreter prefix under /opt: {exc.strerror}")
    try:
        (conda / "lib").mkdir()
        (conda / "bin").mkdir()
        (conda / "bin" / "python3").write_text("")
        for name in ("prefix", "base_prefix", "exec_prefix", "base_exec_prefix"):
            monkeypatch.setattr(sys, name, str(conda))
        monkeypatch.setattr(sys, "_base_executable", str(conda / "bin" / "python3"), raising=False)
        argv = bwrap.bwrap_argv(SandboxConfig(), str(tmp_path), None, {}, ["true"])
        bound = [argv[i + 1] for i, arg in enumerate(argv) if arg in ("--ro-bind", "--bind")]
        launcher = bwrap.launcher_argv(str(tmp_path), None, {}, ["true"], seccomp_hex=None, landlock_require=[])
        readable = json.loads(launcher[-2])["landlock"]["read"]  # the spec, then the command
        needed = {str(conda / "lib"), str(conda / "bin" / "python3")}
        for granted in (bound, readable):
            assert needed <= set(granted)
            assert not [p for p in granted if p == "/opt" or (p.startswith("/opt/") and p not in needed)]
    finally:
        shutil.rmtree(conda)
