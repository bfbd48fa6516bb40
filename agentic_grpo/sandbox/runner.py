"""Running one sandboxed command: start it, feed stdin, read both streams capped, enforce the wall timeout.

`subprocess.run(capture_output=True)` keeps all output in memory and `communicate` has no
cap; with hundreds of concurrent calls we also do not want two reader threads per call. One
selector loop in the calling thread reads both pipes (so neither can fill up and deadlock
the child), keeps the first `cap` bytes of each, drops the rest, and kills the process tree
at the deadline through the layer's own kill function.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable

from .config import ExecResult

_CHUNK = 1 << 16
_DRAIN_AFTER_EXIT_S = 1.0  # a pipe still open after the command exited belongs to a leftover: stop waiting


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def execute(
    argv: list[str],
    *,
    env: dict[str, str],
    stdin: str | bytes | None,
    timeout: float,
    max_output_bytes: int,
    kill: Callable[[subprocess.Popen], None],
    pass_fds: tuple[int, ...] = (),
    cwd: str = "/",
) -> ExecResult:
    """Run argv (a layer's full spawner command line) and collect an ExecResult.

    kill(proc) must end the command's whole process tree (called at the deadline and on errors).
    """
    start = time.monotonic()
    data = stdin.encode() if isinstance(stdin, str) else stdin
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if data else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            close_fds=True,
            pass_fds=pass_fds,
            start_new_session=True,  # done by the C fork helper, not preexec_fn: safe in a threaded trainer
        )
    except OSError as exc:
        return ExecResult("", f"sandbox: cannot start {argv[0]}: {exc}", 127, False, False, time.monotonic() - start)
    buffers: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    truncated = timed_out = False
    deadline = start + timeout
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        selector.register(proc.stderr, selectors.EVENT_READ)
        if data:
            os.set_blocking(proc.stdin.fileno(), False)
            selector.register(proc.stdin, selectors.EVENT_WRITE)
        view = memoryview(data or b"")
        try:
            while selector.get_map():
                now = time.monotonic()
                if not timed_out and now >= deadline:
                    timed_out = True
                    kill(proc)
                    deadline = now + _DRAIN_AFTER_EXIT_S
                elif timed_out and now >= deadline:
                    break
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > _DRAIN_AFTER_EXIT_S:
                    break
                wait = min(deadline - now, 0.05 if exited_at is None else _DRAIN_AFTER_EXIT_S)
                for key, _ in selector.select(max(wait, 0.0)):
                    if key.fileobj is proc.stdin:
                        try:
                            written = os.write(key.fd, view[:_CHUNK])
                        except (BrokenPipeError, OSError):
                            written = len(view)
                        view = view[written:]
                        if not view:
                            selector.unregister(proc.stdin)
                            proc.stdin.close()
                        continue
                    chunk = os.read(key.fd, _CHUNK)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    buf = buffers[key.fd]
                    room = max_output_bytes - len(buf)
                    if len(chunk) > room:
                        truncated = True
                        chunk = chunk[: max(room, 0)]
                    buf += chunk
        finally:
            if proc.poll() is None:
                if not timed_out:
                    # Left the loop with the command alive only on an error or a drained-but-running tree.
                    kill(proc)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None and not stream.closed:
                    stream.close()
    code = None if timed_out else proc.returncode
    return ExecResult(
        stdout=_decode(bytes(buffers[out_fd])),
        stderr=_decode(bytes(buffers[err_fd])),
        exit_code=code,
        timed_out=timed_out,
        truncated=truncated,
        seconds=round(time.monotonic() - start, 6),
    )
