"""Configuration and result types of the sandbox: what a recipe sets and what a tool gets back.

Kept free of any process machinery so that recipes, the CLI and the tools can import the
types without touching namespaces, cgroups or Landlock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

MODES = ("auto", "bwrap", "landlock", "unsafe-local")


class SandboxUnavailable(RuntimeError):
    """No isolation layer works here and the recipe did not opt into `unsafe-local`.

    The message says what was tried, why each layer failed and what to install.
    """


@dataclass
class SandboxConfig:
    """Limits and isolation layer of the slots that run model-written code.

    Every limit applies per command run in a slot; the workspace of a slot lives as long as
    the trajectory that owns it.
    """

    mode: str = field(
        default="auto",
        metadata={
            "help": "Isolation layer: `auto` (strongest that works here; never Landlock without root), `bwrap` "
            "(namespaces), `landlock` "
            "(per-slot uid + Landlock + seccomp, for hosts without user namespaces), or `unsafe-local` "
            "(rlimits only, no isolation: an explicit opt-in that logs a loud warning every run)."
        },
    )
    timeout_s: float = field(
        default=10.0, metadata={"help": "Wall-clock seconds per command; the whole process tree dies after it."}
    )
    memory_mb: int = field(
        default=1024,
        metadata={
            "help": "Address-space limit (RLIMIT_AS) per process, in MB; with a memory cgroup also the slot's "
            "total memory."
        },
    )
    max_processes: int = field(
        default=64,
        metadata={"help": "Most processes and threads alive at once in one slot (RLIMIT_NPROC, pids cgroup)."},
    )
    max_file_mb: int = field(default=64, metadata={"help": "Largest file a command may write (RLIMIT_FSIZE), in MB."})
    max_open_files: int = field(
        default=256, metadata={"help": "Most open file descriptors per process (RLIMIT_NOFILE)."}
    )
    max_output_bytes: int = field(
        default=65536, metadata={"help": "Bytes kept of each of stdout and stderr; the rest is read and dropped."}
    )
    base_uid: int = field(
        default=1_500_000,
        metadata={
            "help": "When the trainer runs as root, slot i of rank r runs as uid/gid base_uid + r * uids_per_rank + i "
            "(uids no real user has: the kernel's process limit and file ownership then separate slots)."
        },
    )
    uids_per_rank: int = field(
        default=4096, metadata={"help": "Slot uids reserved per rank (most slots per process)."}
    )
    workspace_root: str | None = field(
        default=None,
        metadata={"help": "Directory under which slot workspaces are created; default: the system temp directory."},
    )
    use_cgroup: bool = field(
        default=True,
        metadata={
            "help": "Put each slot in its own cgroup (v2 where delegated, v1 as root) bounding its total memory "
            "(memory_mb, including memfd, tmpfs and shared memory pages), processes (max_processes) and CPU "
            "(cpu_cores) when a hierarchy is writable; `sandbox check` says whether one is in force."
        },
    )
    cpu_cores: float = field(
        default=1.0, metadata={"help": "CPU time one slot may use at once, in cores (cgroup cpu quota)."}
    )
    io_mb_per_s: float = field(
        default=50.0,
        metadata={
            "help": "Disk reads and writes one slot may make, in MB/s per disk (cgroup io.max or blkio throttle, "
            "where a cgroup is in force; 0 = no cap). Reads served from the page cache are not counted."
        },
    )
    io_ops_per_s: int = field(
        default=1000,
        metadata={"help": "Disk read and write operations one slot may make per second, per disk (0 = no cap)."},
    )
    workspace_mb: int = field(
        default=256,
        metadata={
            "help": "Total size of a slot's workspace, in MB (a size-limited tmpfs when the trainer runs as root; "
            "0 = a plain directory with no total cap)."
        },
    )
    workspace_inodes: int = field(
        default=16384, metadata={"help": "Most files and directories in a slot's workspace (with workspace_mb)."}
    )
    extra_ro_paths: list[str] = field(
        default_factory=list,
        metadata={"help": "More host paths visible read-only inside slots (e.g. a data directory the tools read)."},
    )

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"sandbox `mode` must be one of {MODES}, got {self.mode!r}")
        for item in fields(self):
            value = getattr(self, item.name)
            kinds, what = _KINDS[str(item.type)]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise ValueError(f"sandbox `{item.name}` must be {what}, got {value!r}")
            if item.name in _POSITIVE and value <= 0:
                raise ValueError(f"sandbox `{item.name}` must be above 0, got {value!r}")
            if item.name in _NOT_NEGATIVE and value < 0:
                raise ValueError(f"sandbox `{item.name}` must be 0 (no cap) or above, got {value!r}")
        if not all(isinstance(path, str) for path in self.extra_ro_paths):
            raise ValueError(f"sandbox `extra_ro_paths` must be a list of paths, got {self.extra_ro_paths!r}")


_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "str": ((str,), "a string"),
    "int": ((int,), "a whole number"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "str | None": ((str, type(None)), "a path"),
    "list[str]": ((list,), "a list of paths"),
}
_POSITIVE = ("timeout_s", "memory_mb", "max_processes", "max_file_mb", "max_open_files", "max_output_bytes",
             "uids_per_rank", "cpu_cores")  # fmt: skip
_NOT_NEGATIVE = ("base_uid", "workspace_mb", "workspace_inodes", "io_mb_per_s", "io_ops_per_s")


@dataclass
class ExecResult:
    """What one command in a slot did.

    Attributes:
        stdout: decoded standard output, at most `max_output_bytes` of it.
        stderr: decoded standard error, at most `max_output_bytes` of it.
        exit_code: the command's exit status; 128 + N = killed by signal N; None = timed out (tree killed).
        timed_out: the wall timeout killed the command's process tree.
        truncated: either stream was longer than the cap.
        seconds: wall-clock time of the call.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)
