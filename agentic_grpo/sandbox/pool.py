"""The slot pool: hands every live trajectory its own slot, in parallel, from many threads.

Slots are cheap (a directory and a reserved uid), so the pool creates them on `acquire`
and destroys them on `release` rather than recycling workspaces: a recycled workspace is
one bug away from leaking one trajectory's files into another.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

from .config import SandboxConfig
from .probe import ProbeReport, require
from .slot import SandboxSlot, Spawner, UidLease, make_workspace, remove_tree

logger = logging.getLogger(__name__)


class SandboxPool:
    """Parallel sandbox slots for one trainer process; thread-safe.

    Args:
        config: limits and isolation layer (default: `SandboxConfig()`).
        rank: the accelerate process index; slot uids and workspaces of different ranks never collide.

    Raises:
        SandboxUnavailable: no isolation layer works and `unsafe-local` was not chosen.
    """

    def __init__(self, config: SandboxConfig | None = None, *, rank: int = 0) -> None:
        self.config = config or SandboxConfig()
        self.rank = rank
        self.report: ProbeReport = require(self.config)
        self.layer: str = self.report.layer
        for warning in self.report.warnings:
            logger.warning(warning)
        self.spawner = Spawner(self.layer, self.config, keep_read_cap=self.report.keep_read_cap)
        parent = self.config.workspace_root or tempfile.gettempdir()
        os.makedirs(parent, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"agentic-grpo-sandbox-r{rank}-", dir=parent))
        self.root.chmod(0o711)  # slot uids may traverse to their own workspace, not list the others
        self._lock = threading.Lock()
        self._live: set[SandboxSlot] = set()
        self._closed = False
        logger.info("sandbox pool (rank %d): layer %s, workspaces under %s", rank, self.layer, self.root)

    def acquire(self) -> SandboxSlot:
        """A new slot with a fresh, empty workspace, owned by the caller until `release`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the sandbox pool is closed")
        lease = None
        uid = None
        if self.report.slot_uids:
            lease = UidLease(self.config.base_uid + self.rank * self.config.uids_per_rank, self.config.uids_per_rank)
            uid = lease.uid
        try:
            workspace = make_workspace(self.root, f"slot-{uid if uid is not None else 'u'}", uid)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        slot = SandboxSlot(self, workspace, uid, lease)
        with self._lock:
            self._live.add(slot)
        return slot

    def release(self, slot: SandboxSlot) -> None:
        """Kill whatever the slot left running and remove its workspace; the slot is unusable after."""
        with self._lock:
            self._live.discard(slot)
        slot.release()

    def close(self) -> None:
        """Release every live slot and remove the pool's directory."""
        with self._lock:
            self._closed = True
            live = list(self._live)
            self._live.clear()
        for slot in live:
            slot.release()
        remove_tree(self.root)

    @property
    def live_slots(self) -> int:
        """How many slots are held right now."""
        with self._lock:
            return len(self._live)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: best effort only
            pass
