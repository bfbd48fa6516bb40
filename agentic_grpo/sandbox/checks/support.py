"""Host-side fixtures of the attack suite: the result type, decoys, listeners and harm detectors.

Split from the registry (`checks/__init__.py`) so the attacks read as a list of hostile programs and their checks.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import ExecResult
from ..pool import SandboxPool
from ..slot import SandboxSlot
from ..workspace import remove_tree


@dataclass
class AttackResult:
    """One attack's outcome: `blocked` is True when it did no harm.

    `gap` is set when the attack did harm that the pool's report already lists as NOT bounded
    on this host (e.g. no disk quota without root): a documented limit, not a hidden hole.
    `skipped` says why the attack could not be tried here (nowhere to plant its bait): no
    harm was done, and none was looked for.
    """

    name: str
    blocked: bool
    detail: str
    gap: str = ""
    skipped: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class Context:
    """Host-side fixtures an attack needs: a loopback listener, a decoy, a fake secret."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self.secret = "AGRPO_FAKE_SECRET_" + secrets.token_hex(8)
        self.trainer_pid = os.getpid()
        self.decoy_dir = Path(tempfile.mkdtemp(prefix="agentic-grpo-decoy-"))
        self.decoy_dir.chmod(0o777)  # world-writable: only the sandbox itself may stop a write here
        self.decoy_file = self.decoy_dir / "decoy.txt"
        self.decoy_file.write_text("original")
        self.decoy_file.chmod(0o666)
        # A stand-in process with the secret in its environment, like the trainer's API keys.
        self.decoy_proc = subprocess.Popen(
            ["sleep", "600"], env={"PATH": "/usr/bin:/bin", "AGRPO_SECRET": self.secret}, start_new_session=True
        )
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.settimeout(0.2)
        self.udp_port = self.udp.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass

    def udp_received(self) -> bool:
        try:
            self.udp.recv(100)
            return True
        except OSError:
            return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.listener.close()
        self.udp.close()
        self.decoy_proc.kill()
        self.decoy_proc.wait()
        remove_tree(self.decoy_dir)


def run_code(slot: SandboxSlot, code: str, **kwargs) -> ExecResult:
    return slot.run_python(textwrap.dedent(code), **kwargs)


def last_json(result: ExecResult) -> dict:
    """The last line of stdout that is a JSON object (what the hostile program reports), or {}."""
    for line in reversed(result.stdout.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def still_growing(path: Path, wait: float = 0.5) -> bool:
    """Whether something still appends to `path` (a heartbeat of a process that should be dead)."""
    try:
        before = path.stat().st_size
    except OSError:
        return False
    time.sleep(wait)
    return path.stat().st_size > before


def uid_processes(uid: int | None) -> list[int]:
    """Host pids of processes owned by a slot uid that remain once the kernel finished tearing the tree down."""
    if uid is None:
        return []
    for _ in range(20):  # SIGKILLed processes take a moment to be reaped after the call returned
        left = _scan_uid(uid)
        if not left:
            return []
        time.sleep(0.1)
    return left


def _scan_uid(uid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:") and int(line.split()[1]) == uid:
                            found.append(int(name))
                            break
            except OSError:
                pass
    return found
