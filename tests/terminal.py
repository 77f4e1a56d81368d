"""A command run as a user's shell runs it: in a pseudo-terminal of a given size, for the tests of what a terminal
shows (live bars, lines fitted to the window)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time

from fault_injection import ENV


def run_in_terminal(command: list[str], columns: int = 120, rows: int = 40, timeout: float = 600) -> tuple[int, str]:
    """``command`` with a pseudo-terminal ``columns`` wide for its stdin, stdout and stderr (the size its own ioctl
    reports, no COLUMNS or LINES to override it): its exit code and everything it wrote there. Killed at
    ``timeout`` seconds."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {key: value for key, value in ENV.items() if key not in ("COLUMNS", "LINES")}
    process = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 1.0)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: every writer has closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            process.kill()
    finally:
        os.close(leader)
    return process.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


def in_a_terminal(command: list[str], columns: int = 120) -> str:
    """What ``command`` writes to a terminal ``columns`` wide; it must succeed."""
    code, out = run_in_terminal(command, columns)
    assert code == 0, out[-3000:]
    return out
