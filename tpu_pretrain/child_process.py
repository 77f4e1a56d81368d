"""A child process run with its output passed on line by line as it comes, for commands that run a step apart.

Why apart: the TPU environment's ``tpu-pretrain``, ``tpu-check``'s probes and the JAX accelerator check each run in a
process of their own, so the caller never loads a framework or holds an accelerator; both backends stream them the
same way. Nothing here imports a framework.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Sequence


def stream(command: Sequence[str], *, env: dict[str, str] | None = None, echo: Callable[[str], None] | None = None,
           keep: int = 400, timeout: float | None = None) -> tuple[int, str]:
    """Run a command, passing each line of its output on as it comes; (exit status, the last ``keep`` lines).

    Ctrl-C (a notebook's interrupt) is passed on to the command, which then stops cleanly (training saves first).
    After ``timeout`` seconds the command is killed (status -9).
    """
    echo = echo or (lambda line: print(line, end="", flush=True))
    tail: deque[str] = deque(maxlen=keep)
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", bufsize=1, env=env)
    timer = threading.Timer(timeout, process.kill) if timeout else None
    if timer:
        timer.start()
    try:
        for line in process.stdout:
            echo(line)
            tail.append(line)
        return process.wait(), "".join(tail)
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        process.wait()
        raise
    finally:
        if timer:
            timer.cancel()
