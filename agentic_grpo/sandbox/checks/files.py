"""Attacks on the filesystem: the host's secrets, a sibling's workspace, training data under /opt, the trainer's
environment, writes outside the workspace and through planted links."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import textwrap
from pathlib import Path

from ..bwrap import interpreter_paths
from ..slot import SandboxSlot
from ..workspace import remove_tree
from .support import AttackResult, Context, last_json, run_code


def read_shadow(ctx: Context, slot: SandboxSlot) -> AttackResult:
    result = run_code(slot, "print(open('/etc/shadow').read())")
    blocked = result.exit_code != 0 and "root:" not in result.stdout
    return AttackResult("read_shadow", blocked, (result.stderr.strip().splitlines() or ["(no error)"])[-1])


def read_sibling(ctx: Context, slot: SandboxSlot) -> AttackResult:
    sibling = ctx.pool.acquire()
    try:
        (sibling.workspace / "secret.txt").write_text(ctx.secret)
        result = run_code(
            slot,
            f"""
            import os
            target = {str(sibling.workspace / "secret.txt")!r}
            for path in (target, os.path.dirname(target), os.path.dirname(os.path.dirname(target))):
                try:
                    print("LIST", sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read())
                except OSError as exc:
                    print("denied", exc.errno)
            """,
        )
    finally:
        ctx.pool.release(sibling)
    listings = [line for line in result.stdout.splitlines() if line.startswith("LIST")]
    seen = any(os.path.basename(str(sibling.workspace)) in line for line in listings)
    blocked = ctx.secret not in result.stdout and not seen
    return AttackResult("read_sibling", blocked, result.stdout.strip()[-400:])


def read_opt_data(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Training data where SageMaker puts it: a train.jsonl planted under /opt, read and /opt listed from the slot.

    Skipped where /opt can neither take the bait (not writable) nor show anything to hide.
    """
    needed = {os.path.abspath(p) for p in [*interpreter_paths(), *ctx.pool.config.extra_ro_paths]}
    granted = {p.split("/")[2] for p in needed if p.startswith("/opt/")}  # what slots may see of /opt
    planted, why = None, ""
    try:
        planted = Path(tempfile.mkdtemp(prefix="agentic-grpo-attack-", dir="/opt"))
    except OSError as exc:
        why = f"cannot plant under /opt: {exc.strerror}"
    try:
        target = ""
        if planted is not None:
            data = planted / "ml" / "input" / "data"
            data.mkdir(parents=True)
            (data / "train.jsonl").write_text(json.dumps({"prompt": "What is the password?", "answer": ctx.secret}))
            # Readable by every uid, so only the sandbox can stop the read.
            for directory in (planted, planted / "ml", planted / "ml" / "input", data):
                directory.chmod(0o755)
            (data / "train.jsonl").chmod(0o644)
            target = str(data / "train.jsonl")
        try:
            hidden = set(os.listdir("/opt")) - granted
        except OSError:
            hidden = set()
        if not hidden:  # nothing planted (why says why) and nothing of the host's own to look for
            return AttackResult("read_opt_data", True, why, skipped=f"{why}, and it shows nothing to hide")
        result = run_code(
            slot,
            f"""
            import json, os
            out = {{}}
            try:
                out["listing"] = sorted(os.listdir("/opt"))
            except OSError as exc:
                out["listing"] = f"denied {{exc.errno}}"
            if {target!r}:
                try:
                    out["read"] = open({target!r}).read()
                except OSError as exc:
                    out["read"] = f"denied {{exc.errno}}"
            print(json.dumps(out))
            """,
        )
    finally:
        if planted is not None:
            remove_tree(planted)
    seen = last_json(result)
    listing = seen.get("listing")
    visible = sorted(hidden & set(listing)) if isinstance(listing, list) else []
    leaked = ctx.secret in result.stdout + result.stderr
    ran = "listing" in seen  # a program that never ran proves nothing
    detail = f"planted={target or why!r} leaked={leaked} visible in /opt={visible[:5]} "
    detail += f"code said {seen or result.stderr[-200:]}"
    return AttackResult("read_opt_data", ran and not leaked and not visible, detail[:600])


def read_trainer_environ(ctx: Context, slot: SandboxSlot) -> AttackResult:
    os.environ["AGRPO_SECRET"] = ctx.secret  # in the trainer's environment while the code runs
    try:
        result = run_code(
            slot,
            f"""
            import os
            print(dict(os.environ))
            for pid in [{ctx.trainer_pid}, {ctx.decoy_proc.pid}, os.getppid()] + [p for p in os.listdir('/proc') if p.isdigit()]:
                try:
                    print(pid, open(f'/proc/{{pid}}/environ', 'rb').read()[:4000])
                except OSError as exc:
                    print(pid, 'denied', exc.errno)
            """,
        )
    finally:
        os.environ.pop("AGRPO_SECRET", None)
    blocked = ctx.secret not in result.stdout and ctx.secret not in result.stderr
    return AttackResult("read_trainer_environ", blocked, result.stdout.strip()[-400:])


def _write_each(paths: str) -> str:
    """Code that writes to each path of the Python expression `paths` and prints WROTE or denied for each."""
    return f"""
for path in {paths}:
    try:
        with open(path, 'w') as f:
            f.write('pwned')
        print('WROTE', path)
    except OSError as exc:
        print('denied', path, exc.errno)
"""


def write_outside(ctx: Context, slot: SandboxSlot) -> AttackResult:
    token = secrets.token_hex(6)
    targets = [
        str(ctx.decoy_file),
        str(ctx.decoy_dir / f"new-{token}"),
        f"/tmp/agentic-grpo-attack-{token}",
        f"/dev/shm/agentic-grpo-attack-{token}",
        str(slot.workspace.parent / f"attack-{token}"),
        str(Path(__file__).with_name(f"attack-{token}.py")),
    ]
    result = run_code(slot, _write_each(repr(targets)))
    harmed = [t for t in targets[1:] if os.path.exists(t)]
    if ctx.decoy_file.read_text() != "original":
        harmed.append(str(ctx.decoy_file))
    for path in harmed:
        if path != str(ctx.decoy_file):
            os.unlink(path)
    return AttackResult("write_outside", not harmed, f"harmed: {harmed}" if harmed else result.stdout.strip()[-400:])


def symlink_escape(ctx: Context, slot: SandboxSlot) -> AttackResult:
    token = secrets.token_hex(6)
    created = ctx.decoy_dir / f"via-link-{token}"
    links = textwrap.dedent(f"""
        import os
        os.symlink({str(ctx.decoy_file)!r}, 'to_decoy')
        os.symlink({str(created)!r}, 'to_new')
        os.symlink('/', 'to_root')
        os.symlink({str(ctx.decoy_file)!r}, '.agentic_grpo_main.py')  # bait for the trainer's own writes
        """)  # fmt: skip
    result = run_code(slot, links + _write_each(f"('to_decoy', 'to_new', 'to_root/tmp/agentic-grpo-link-{token}')"))
    harmed = [p for p in (str(created), f"/tmp/agentic-grpo-link-{token}") if os.path.exists(p)]
    if ctx.decoy_file.read_text() != "original":
        harmed.append(str(ctx.decoy_file))
    # The trainer side too: a link planted in the workspace must not make the host write outside.
    big = "x = 1\n" * 20_000 + "print('big ok')\n"
    slot.run_python(big)
    if ctx.decoy_file.read_text() != "original":
        harmed.append("host wrote through a planted link")
    return AttackResult("symlink_escape", not harmed, f"harmed: {harmed}" if harmed else result.stdout.strip()[-400:])
