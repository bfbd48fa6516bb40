"""What a slot uid may leave in the kernel after its calls: processes and SysV IPC objects.

The seccomp filter refuses SysV IPC on every confined layer, so `remove_ipc` normally finds
nothing; it runs at every release as root anyway, because a uid is reused by the next
slot and nothing of one trajectory may reach the next (defence in depth, and it also
covers unsafe-local slot uids).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_IPC_RMID = 0
_LIBC = ctypes.CDLL(None, use_errno=True)


def kill_uid(uid: int) -> None:
    """SIGKILL every process of a slot uid (kill(-1) as that uid reaches exactly those)."""
    setpriv, killer = shutil.which("setpriv"), shutil.which("kill")
    if os.geteuid() != 0 or not setpriv or not killer:
        return
    for _ in range(2):  # a fork bomb may spawn between rounds; the process limit bounds it
        subprocess.run(
            [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", killer, "-KILL", "-1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": SAFE_PATH},
            check=False,
        )


def ipc_objects(uid: int) -> dict[str, list[int]]:
    """{'shm'|'msg'|'sem': [ids]} of the SysV IPC objects a uid owns or created, in this IPC namespace."""
    found: dict[str, list[int]] = {}
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                header = f.readline().split()
                rows = [line.split() for line in f]
        except OSError:
            continue
        col = {name: i for i, name in enumerate(header)}
        # The id is the second column (shmid, msqid, semid); owner and creator are named.
        ids = [int(r[1]) for r in rows if str(uid) in (r[col["uid"]], r[col["cuid"]])]
        if ids:
            found[kind] = ids
    return found


def remove_ipc(uid: int) -> list[str]:
    """Remove every SysV IPC object of a uid (as root); the ones that could not be removed."""
    if os.geteuid() != 0:
        return []
    failed = []
    for kind, ids in ipc_objects(uid).items():
        for ident in ids:
            call = {"shm": _LIBC.shmctl, "msg": _LIBC.msgctl, "sem": _LIBC.semctl}[kind]
            result = call(ident, 0, _IPC_RMID, None) if kind == "sem" else call(ident, _IPC_RMID, None)
            if result != 0:
                failed.append(f"{kind} {ident}: {os.strerror(ctypes.get_errno())}")
    return failed
