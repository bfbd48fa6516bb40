"""The slot pool: hands every live trajectory its own slot, in parallel, from many threads.

Slots are cheap (a directory or tmpfs, a reserved uid, a cgroup), so the pool creates them
on `acquire` and destroys them on `release` rather than recycling workspaces: a recycled
workspace is one bug away from leaking one trajectory's files into another.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

from .cgroup import CgroupLimits, CgroupSet
from .config import SandboxConfig
from .probe import ProbeReport, require
from .protections import bounds
from .slot import SandboxSlot, Spawner, UidLease
from .workspace import make_workspace, release_workspace, remove_stale_pools, remove_tree

logger = logging.getLogger(__name__)
_POOL_NUMBERS = itertools.count()  # names each pool's cgroup apart from the other pools of this process


class SandboxPool:
    """Parallel sandbox slots for one trainer process; thread-safe.

    Args:
        config: limits and isolation layer (default: `SandboxConfig()`).
        rank: the accelerate process index; slot uids and workspaces of different ranks never collide.

    Attributes:
        report: the probe's report plus what this pool bounds (`cgroup`, `bounds`).
        layer: the isolation layer in use.

    Raises:
        SandboxUnavailable: no isolation layer works and `unsafe-local` was not chosen.
    """

    def __init__(self, config: SandboxConfig | None = None, *, rank: int = 0) -> None:
        self.config = config or SandboxConfig()
        self.rank = rank
        probed = require(self.config)
        self.layer: str = probed.layer
        root = os.geteuid() == 0
        self.cgroups = (
            # One group per pool, even with two pools of one rank in one process (each its own slots and bounds).
            CgroupSet.detect(f"agentic-grpo-{os.getpid()}-r{rank}-p{next(_POOL_NUMBERS)}")
            if self.config.use_cgroup
            else CgroupSet(None, {}, "use_cgroup is off")
        )
        parent = self.config.workspace_root or tempfile.gettempdir()
        os.makedirs(parent, exist_ok=True)
        self.quota, quota_problem = root and self.config.workspace_mb > 0, ""
        if self.quota:
            # Root without CAP_SYS_ADMIN (a container) cannot mount: say so instead of failing every acquire.
            try:
                trial, _ = make_workspace(Path(parent), "agentic-grpo-quota-check", None, size_mb=1, inodes=16)
                release_workspace(trial, True)
            except OSError as exc:
                self.quota, quota_problem = False, f"cannot mount a tmpfs here: {exc.strerror or exc}"
        self.report: ProbeReport = dataclasses.replace(
            probed,
            warnings=list(probed.warnings),
            cgroup=self.cgroups.describe(),
            bounds=bounds(self.layer, self.config, root, self.cgroups.bounded, self.quota, quota_problem),
        )
        if probed.downgraded:
            print(f"WARNING: sandbox: {probed.downgraded}", file=sys.stderr)
        for warning in self.report.warnings:
            logger.warning(warning)
        features = tuple(name for name, on in probed.landlock_features.items() if on)
        self.spawner = Spawner(
            self.layer, self.config, allow_memfd="memory" in self.cgroups.bounded, landlock_require=features
        )
        # Named with the pid, so the next pool can tell (and clean) what a killed trainer left.
        remove_stale_pools(Path(parent), "agentic-grpo-sandbox-")
        self.cgroups.remove_stale()
        self.root = Path(tempfile.mkdtemp(prefix=f"agentic-grpo-sandbox-{os.getpid()}-r{rank}-", dir=parent))
        # Only the Landlock layer's slot uids reach their workspace by its host path (traverse, never list);
        # bwrap binds it and slots without root share the trainer's uid. Closed to everyone else, no other local
        # user can enter a workspace whatever its code does to it (opens it, leaves a FIFO or a setuid copy).
        self.root.chmod(0o711 if root and self.layer == "landlock" else 0o700)
        self._lock = threading.Lock()
        self._live: set[SandboxSlot] = set()
        self._closed = False
        self.release_failures = 0
        logger.info("sandbox pool (rank %d): layer %s, workspaces under %s, %s", rank, self.layer, self.root,
                    self.report.cgroup)  # fmt: skip

    def acquire(self) -> SandboxSlot:
        """A new slot with a fresh, empty workspace (and its own cgroup when in force), owned until `release`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the sandbox pool is closed")
        lease = uid = group = workspace = None
        mounted = False
        try:
            if self.report.slot_uids:
                lease = UidLease(
                    self.config.base_uid + self.rank * self.config.uids_per_rank, self.config.uids_per_rank
                )
                uid = lease.uid
            name = f"slot-{uid if uid is not None else 'u'}"
            workspace, mounted = make_workspace(
                self.root,
                name,
                uid,
                size_mb=self.config.workspace_mb if self.quota else 0,
                inodes=self.config.workspace_inodes,
            )
            if self.cgroups.version is not None:
                config = self.config
                limits = CgroupLimits(config.memory_mb << 20, config.max_processes, config.cpu_cores,
                                      int(config.io_mb_per_s * (1 << 20)), config.io_ops_per_s)  # fmt: skip
                group = self.cgroups.take(limits)
        except BaseException:
            # Undo what was made; a half-made slot must not keep a uid or a mount.
            slot = SandboxSlot(self, workspace or self.root / "missing", uid, lease, cgroup=group, mounted=mounted)
            if workspace is None:
                slot.closed = True
                if lease is not None:
                    lease.release()
            else:
                slot.release()
            raise
        slot = SandboxSlot(self, workspace, uid, lease, cgroup=group, mounted=mounted)
        with self._lock:
            self._live.add(slot)
            self.cgroups.weigh(len(self._live))
        return slot

    def release(self, slot: SandboxSlot) -> None:
        """Kill whatever the slot left running and remove its workspace; never raises (failures are logged)."""
        with self._lock:
            self._live.discard(slot)
            self.cgroups.weigh(len(self._live))
        if slot.release():
            with self._lock:
                self.release_failures += 1

    def close(self) -> None:
        """Release every live slot (each one whatever happened to the others) and remove the pool's directories."""
        with self._lock:
            self._closed = True
            live = list(self._live)
            self._live.clear()
        for slot in live:
            if slot.release():
                self.release_failures += 1
        self.cgroups.close()
        try:
            remove_tree(self.root)
        except OSError as exc:
            logger.error("sandbox: cannot remove %s: %s", self.root, exc)

    def metrics(self) -> dict[str, float]:
        """Numbers for training logs: whether `auto` fell back, whether cgroups bound the slots, failed releases."""
        return {
            "sandbox/downgraded": float(self.report.downgraded is not None),
            "sandbox/cgroup": float(self.cgroups.version is not None),
            "sandbox/release_failures": float(self.release_failures),
        }

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
