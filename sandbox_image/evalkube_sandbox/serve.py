"""The grader container's entry point in a pod: one fresh worker per runner connection.

``python -m evalkube_sandbox --listen /run/evalkube/worker/worker.sock`` listens on a unix
socket in an emptyDir shared with the ``runner`` container. Each connection gets a forked
worker whose stdin/stdout are the connection. When the runner hangs up (it does so to
enforce a deadline), the supervisor kills the worker's whole process group, so a grader
stuck in a loop cannot outlive its deadline; the next connection starts a fresh worker.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys

POLLRDHUP = getattr(select, "POLLRDHUP", 0x2000)


def _child(conn: socket.socket) -> None:
    os.setsid()
    fd = conn.fileno()
    os.dup2(fd, 0)
    os.dup2(fd, 1)
    conn.close()
    from evalkube_sandbox.worker import main

    os._exit(main())


def _supervise(conn: socket.socket, pid: int) -> None:
    poller = select.poll()
    poller.register(conn.fileno(), POLLRDHUP | select.POLLHUP | select.POLLERR)
    while True:
        finished, _status = os.waitpid(pid, os.WNOHANG)
        if finished:
            break
        events = poller.poll(200)
        if any(mask & (POLLRDHUP | select.POLLHUP | select.POLLERR) for _, mask in events):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
    conn.close()


def serve(path: str) -> int:
    """Accept runner connections forever, one worker at a time."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o660)
    server.listen(1)
    print(f"evalkube-sandbox: listening on {path}", file=sys.stderr, flush=True)
    while True:
        conn, _ = server.accept()
        pid = os.fork()
        if pid == 0:
            server.close()
            _child(conn)
        _supervise(conn, pid)
