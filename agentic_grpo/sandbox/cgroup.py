"""Per-slot cgroups: memory (including memfd, tmpfs and shared-memory pages), processes, CPU and disk I/O.

Each slot gets its own group under the trainer's own cgroup: cgroup v2 where the host
delegates one with the memory and pids controllers enabled for children, else the v1
memory/pids/cpu/blkio hierarchies when they are writable (root on a hybrid host). A command
joins its slot's group before anything of it runs: a `/bin/sh` wrapper writes its own pid
to the group's `cgroup.procs` files and then execs the layer's command line, so every
process the code starts is counted. When no hierarchy is writable, `detect` says why and
the other layers' bounds (rlimits, seccomp) are all there is.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu", "io")
_V1_NAMES = {"blkio": "io"}  # v1 calls the I/O controller blkio
# "0" written to a v1 `tasks` file moves the writing thread only (the shell is single-threaded, so
# the whole process) without the global threadgroup lock, whose RCU grace period (~8 ms on a busy
# host) a `cgroup.procs` write pays; v2 has no such file, and gets the pid in cgroup.procs.
_JOIN = 'while [ "$1" != -- ]; do echo "${2:-$$}" > "$1" || exit 125; shift 2; done; shift; exec "$@"'
_PERIOD_US = 100_000


@dataclass
class CgroupLimits:
    """What one slot's group bounds."""

    memory_bytes: int
    pids: int
    cpu_cores: float
    io_bytes_per_s: int = 0
    io_ops_per_s: int = 0


def _mounts() -> tuple[str | None, dict[str, str]]:
    """(cgroup2 mount point, {v1 controller: mount point}) from /proc/self/mountinfo."""
    v2, v1 = None, {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3 or fields[3] != "/":
                continue  # a bind of a sub-tree: paths in /proc/self/cgroup would not map onto it
            if rest[0] == "cgroup2" and v2 is None:
                v2 = fields[4]
            elif rest[0] == "cgroup":
                for option in rest[2].split(","):
                    option = _V1_NAMES.get(option, option)
                    if option in CONTROLLERS and option not in v1:
                        v1[option] = fields[4]
    return v2, v1


def _own_paths() -> dict[str, str]:
    """{controller or '' (v2): this process's cgroup path} from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(",") if names else [""]:
                paths[_V1_NAMES.get(name, name)] = path
    return paths


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class SlotCgroup:
    """One slot's group (one directory per hierarchy)."""

    def __init__(self, dirs: list[Path], controllers: list[str]) -> None:
        self.dirs = dirs
        self.controllers = controllers

    def has(self, controller: str) -> bool:
        """Whether this group bounds `controller` (memory, pids, cpu or io)."""
        return controller in self.controllers

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run by a shell that first joins this group (exit 125 if it cannot: nothing runs unbounded)."""
        pairs: list[str] = []
        for d in self.dirs:
            pairs += [str(d / "tasks"), "0"] if (d / "tasks").exists() else [str(d / "cgroup.procs"), ""]
        return ["/bin/sh", "-c", _JOIN, "sh", *pairs, "--", *argv]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for directory in self.dirs:
            try:
                found.update(int(x) for x in (directory / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL everything in the group (cgroup.kill on v2; pid by pid on v1, until none is left)."""
        for directory in self.dirs:
            if (directory / "cgroup.kill").exists():
                try:
                    _write(directory / "cgroup.kill", "1")
                except OSError:
                    pass
        for _ in range(100):
            left = self.pids()
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is left and remove the group's directories; never raises (logs what stays)."""
        self.kill()
        for directory in self.dirs:
            for attempt in range(50):  # killed processes leave the group once reaped
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if attempt == 49:
                        logger.error("sandbox: cannot remove cgroup %s: %s", directory, exc)
                    time.sleep(0.02)


class CgroupSet:
    """The pool's parent groups, one per hierarchy; `create` adds a slot's group under them.

    Attributes:
        version: 2, 1 or None (no writable hierarchy; `reason` says why).
        bounded: which of memory, pids, cpu, io the slot groups bound (io only on a host with disks).
    """

    def __init__(self, version: int | None, parents: dict[str, Path], reason: str = "") -> None:
        self._free: list[SlotCgroup] = []
        self._made = 0
        self._lock = threading.Lock()
        self.version = version
        self.parents = parents
        self.reason = reason
        self.bounded = sorted(parents) if version == 1 else (list(CONTROLLERS) if version == 2 else [])
        if version == 2:
            self.bounded = [c for c in CONTROLLERS if c in _read(parents["unified"] / "cgroup.subtree_control")]
        self.disks = self._disks_taking_limits() if "io" in self.bounded else []
        if not self.disks:
            self.bounded = [c for c in self.bounded if c != "io"]

    def _disks_taking_limits(self) -> list[str]:
        """The host's disks whose I/O a group here can limit, tried on a scratch group (a disk whose driver
        has no throttling, or a v2 hierarchy without io delegated, refuses the limit)."""
        parent = self.parents.get("io") or self.parents.get("unified")
        if parent is None:
            return []
        trial, taken = parent / "io-check", []
        try:
            trial.mkdir()
        except OSError:
            return []
        try:
            for disk in disks():
                try:
                    if self.version == 2:
                        _write(trial / "io.max", f"{disk} riops=1000000")
                    else:
                        _write(trial / "blkio.throttle.read_iops_device", f"{disk} 1000000")
                    taken.append(disk)
                except OSError:
                    pass
        finally:
            trial.rmdir()
        return taken

    @classmethod
    def detect(cls, tag: str) -> CgroupSet:
        """Create the pool's parent groups (named by `tag`) in the first writable hierarchy."""
        try:
            v2, v1 = _mounts()
            own = _own_paths()
        except OSError as exc:
            return cls(None, {}, f"cannot read /proc/self cgroup information: {exc}")
        reasons = []
        if v2 is not None and "" in own:
            base = Path(v2 + own[""])
            try:
                # Children of `base` get the controllers `base` enables for its subtree; enabling them here
                # works only where `base` holds no process (a delegated subtree) or is the root group.
                enabled = _read(base / "cgroup.subtree_control").split()
                offered = [c for c in CONTROLLERS if c in _read(base / "cgroup.controllers").split()]
                if not {"memory", "pids"} <= set(enabled) and {"memory", "pids"} <= set(offered):
                    try:
                        _enable_for_children(base, offered)
                    except OSError as exc:
                        raise OSError(f"cannot enable {offered} for children ({exc.strerror}): run the trainer "
                                      "in a delegated cgroup (systemd Delegate=yes) from a leaf of its own") from exc  # fmt: skip
                    enabled = _read(base / "cgroup.subtree_control").split()
                if not {"memory", "pids"} <= set(enabled):
                    raise OSError(f"controllers {offered or 'none'} offered (memory and pids on v1 or not delegated)")
                wanted = [c for c in CONTROLLERS if c in enabled]
                parent = base / tag
                parent.mkdir()
                try:
                    _enable_for_children(parent, wanted)
                except OSError:
                    parent.rmdir()
                    raise
                return cls(2, {"unified": parent})
            except OSError as exc:
                reasons.append(f"cgroup v2 at {base}: {exc}")
        else:
            reasons.append("no cgroup v2 mount")
        parents: dict[str, Path] = {}
        for controller in CONTROLLERS:
            if controller not in v1 or controller not in own:
                reasons.append(f"no v1 {controller} hierarchy")
                continue
            parent = Path(v1[controller] + own[controller]) / tag
            try:
                parent.mkdir()
                parents[controller] = parent
            except OSError as exc:
                reasons.append(f"v1 {controller} at {parent.parent}: {exc.strerror or exc}")
        if {"memory", "pids"} <= set(parents):
            return cls(1, parents, "; ".join(reasons))
        for parent in parents.values():
            os.rmdir(parent)
        return cls(None, {}, "; ".join(reasons))

    def remove_stale(self, prefix: str = "agentic-grpo-") -> None:
        """Remove the groups of pools whose trainer died without closing them (named prefix + pid + '-rR-pN')."""
        pattern = re.compile(re.escape(prefix) + r"(\d+)-r\d+(-p\d+)?$")
        for parent in self.parents.values():
            for entry in parent.parent.iterdir():
                match = pattern.match(entry.name)
                if not match or not entry.is_dir() or os.path.exists(f"/proc/{match.group(1)}"):
                    continue
                for child in [d for d in entry.iterdir() if d.is_dir()]:
                    SlotCgroup([child], []).remove()
                try:
                    os.rmdir(entry)
                except OSError as exc:
                    logger.warning("sandbox: stale cgroup %s stays: %s", entry, exc)

    def weigh(self, live_slots: int) -> None:
        """Give the pool's parent group the CPU weight of `live_slots` processes.

        Group scheduling makes all slots one entity against the host's other processes: at the
        default weight, every sandboxed call together would get one process's share of a busy
        host, and many slots would run slower than as many plain processes. Weighing one process
        per live slot keeps each slot's share what a plain process had; each slot stays capped by
        its quota.
        """
        if self.version == 1 and "cpu" in self.parents:
            path, weight = self.parents["cpu"] / "cpu.shares", min(262144, 1024 * max(1, live_slots))
        elif self.version == 2 and "cpu" in self.bounded:
            path, weight = self.parents["unified"] / "cpu.weight", min(10000, 100 * max(1, live_slots))
        else:
            return
        try:
            _write(path, str(weight))
        except OSError as exc:
            logger.warning("sandbox: cannot set the pool's cpu weight %s: %s", path, exc)

    def take(self, limits: CgroupLimits) -> SlotCgroup:
        """A slot's group: an empty one a released slot gave back (same pool, same limits), or a new one.

        Recycling saves creating and removing three directories per slot, whose teardown waits on
        RCU; a group holds counters only, never data of the slot that used it before.
        """
        with self._lock:
            if self._free:
                return self._free.pop()
            self._made += 1
            name = f"slot-{self._made}"
        return self.create(name, limits)

    def give_back(self, group: SlotCgroup) -> None:
        """Kill what is left in a released slot's group; keep it for the next slot if it is empty."""
        group.kill()
        if group.pids():
            group.remove()
            return
        with self._lock:
            self._free.append(group)

    def create(self, name: str, limits: CgroupLimits) -> SlotCgroup:
        """A slot's group with its limits set; raises OSError (and removes what it made) on failure."""
        dirs = [parent / name for parent in self.parents.values()]
        group = SlotCgroup([], self.bounded)
        try:
            for directory in dirs:
                directory.mkdir()
                group.dirs.append(directory)
            for directory in dirs:
                self._limit(directory, limits)
        except OSError:
            group.remove()
            raise
        return group

    def _limit(self, directory: Path, limits: CgroupLimits) -> None:
        quota = max(1000, int(limits.cpu_cores * _PERIOD_US))
        names = {f.name for f in directory.iterdir()}
        bps, iops = limits.io_bytes_per_s or "max", limits.io_ops_per_s or "max"
        if self.version == 2:
            settings = [("memory.max", limits.memory_bytes), ("memory.swap.max", 0), ("pids.max", limits.pids),
                        ("cpu.max", f"{quota} {_PERIOD_US}")]  # fmt: skip
            settings += [("io.max", f"{disk} rbps={bps} wbps={bps} riops={iops} wiops={iops}") for disk in self.disks]
        else:
            settings = [("memory.limit_in_bytes", limits.memory_bytes),
                        ("memory.memsw.limit_in_bytes", limits.memory_bytes), ("pids.max", limits.pids),
                        ("cpu.cfs_period_us", _PERIOD_US), ("cpu.cfs_quota_us", quota)]  # fmt: skip
            # v1 has no "max": 0 removes a device's rule (a fresh group has none)
            for file, value in (("bps", limits.io_bytes_per_s), ("iops", limits.io_ops_per_s)):
                if value:
                    settings += [(f"blkio.throttle.{way}_{file}_device", f"{disk} {value}")
                                 for disk in self.disks for way in ("read", "write")]  # fmt: skip
        for file, value in settings:
            if file in names:  # memsw/swap files exist only with swap accounting
                _write(directory / file, str(value))

    def close(self) -> None:
        """Remove the kept slot groups and the pool's parent groups (after every slot was released)."""
        with self._lock:
            free, self._free = self._free, []
        for group in free:
            group.remove()
        for parent in self.parents.values():
            try:
                os.rmdir(parent)
            except OSError as exc:
                logger.error("sandbox: cannot remove cgroup %s: %s", parent, exc)

    def describe(self) -> str:
        if self.version is None:
            return f"not in force ({self.reason})"
        where = ", ".join(str(p) for p in self.parents.values())
        return f"cgroup v{self.version} per slot ({', '.join(self.bounded)}) under {where}"


def _enable_for_children(group: Path, controllers: list[str]) -> None:
    """Enable `controllers` for `group`'s children (v2); raises OSError if any but io is refused. io is optional:
    without it, disk I/O is reported as not bounded."""
    _write(group / "cgroup.subtree_control", " ".join("+" + c for c in controllers if c != "io"))
    if "io" in controllers:
        try:
            _write(group / "cgroup.subtree_control", "+io")
        except OSError:
            pass


def disks() -> list[str]:
    """The MAJ:MIN of every whole disk with a size: the devices I/O limits apply to (loop, RAM and empty devices
    are left out; partitions share their disk's limit)."""
    found = []
    for entry in sorted(Path("/sys/block").glob("*")):
        if entry.name.startswith(("loop", "ram", "zram")) or _read(entry / "size").strip() in ("", "0"):
            continue
        number = _read(entry / "dev").strip()
        if number:
            found.append(number)
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
