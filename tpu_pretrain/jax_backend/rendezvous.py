"""Before JAX's runtime starts: every process given ``--coordinator_address``, ``--num_processes`` and
``--process_index`` first meets process 0 at that address, in plain Python.

Why a meeting of our own: ``jax.distributed.initialize`` waits in native code that holds the interpreter. A process
that never comes means silence until JAX's own timeout, SIGTERM kills without a word, two processes given the same
index end in a native abort, and a port another program holds ends in "Failed to start RPC server". Here process 0
listens on the coordinator's port and answers each process that says hello (its index) at once; the others retry
until process 0 answers. Every wait says what it waits for and until when (``--worker_wait_minutes``), a signal
stops it with the tool's own message, and a duplicate index, a taken port or another program at the address is
refused by name. When all have come, process 0 closes the port and JAX's runtime starts on it. No framework is
imported.
"""

from __future__ import annotations

import json
import logging
import math
import select
import socket
import time

from ..errors import UserInputError
from ..formatting import hms
from ..runtime import sigterm_as_interrupt

log = logging.getLogger(__name__)

MAGIC = "tpu-pretrain/processes/1"
ANSWER_SECONDS = 5.0  # how long a hello waits for process 0's answer before the address counts as another program's
POLL_SECONDS = 0.5
CLOSED = {"closed": True}  # what a read returns when the other end closed the connection
SAY_EVERY_SECONDS = 60.0


def meet(address: str, count: int, index: int, wait_minutes: float) -> None:
    """Wait until every one of ``count`` processes has met process 0 at ``address``, up to ``wait_minutes``."""
    deadline = time.time() + wait_minutes * 60
    until = f"giving up at {time.strftime('%H:%M:%S', time.localtime(deadline))} (--worker_wait_minutes " \
            f"{wait_minutes:g}); Ctrl-C or SIGTERM stops"
    meeting = _Meeting(address, count, index, deadline, until, f"{hms(wait_minutes * 60)} (--worker_wait_minutes)")
    try:
        with sigterm_as_interrupt():
            meeting.lead() if index == 0 else meeting.follow()
    except KeyboardInterrupt:
        log.error("Process %d of %d stopped while waiting for %s at %s: nothing was trained.", index, count,
                  meeting.awaited(), address)
        raise


class _Meeting:
    def __init__(self, address: str, count: int, index: int, deadline: float, until: str, within: str):
        self.address, self.count, self.index, self.deadline, self.until, self.within = (
            address, count, index, deadline, until, within)
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.joined: dict[int, tuple[socket.socket, str]] = {}

    def missing(self) -> list[int]:
        return [i for i in range(1, self.count) if i not in self.joined]

    def awaited(self) -> str:
        if self.index:
            return f"process 0 of {self.count}"
        missing = self.missing()
        return f"process{'es' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {self.count}"

    # -- process 0 --------------------------------------------------------------------------------
    def lead(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("", self.port))
        except OSError as exc:
            listener.close()
            self._port_taken(exc)
        listener.listen(64)
        listener.settimeout(POLL_SECONDS)
        said = -math.inf
        try:
            while missing := self.missing():
                if time.time() >= self.deadline:
                    raise UserInputError(
                        f"{self.awaited().capitalize()} did not arrive at {self.address} within {self.within}: "
                        "start the same train command on each with its own --process_index, check that "
                        f"{self.address} is reachable from it, then run this one again.")
                if time.time() - said >= SAY_EVERY_SECONDS:
                    log.warning("Process 0 of %d: waiting for %s at %s, %s.", self.count, self.awaited(),
                                self.address, self.until)
                    said = time.time()
                    for conn, _ in self.joined.values():
                        _send(conn, {"waiting": missing})
                self._drop_gone()
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                self._welcome(conn)
            for conn, _ in self.joined.values():
                _send(conn, {"go": True})
            log.info("All %d processes arrived at %s.", self.count, self.address)
        except (UserInputError, KeyboardInterrupt) as exc:
            said = str(exc) if isinstance(exc, UserInputError) else "process 0 was stopped (Ctrl-C or SIGTERM)"
            for conn, _ in self.joined.values():
                _send(conn, {"error": said})
            raise
        finally:
            listener.close()
            for conn, _ in self.joined.values():
                conn.close()

    def _welcome(self, conn: socket.socket) -> None:
        hello = _read(conn, ANSWER_SECONDS)
        if not hello or hello is CLOSED or hello.get("magic") != MAGIC:  # not ours: a port scanner, a health check
            conn.close()
            return
        index, host, count = hello.get("index"), hello.get("host", "?"), hello.get("count")
        problem = ""
        if count != self.count:
            problem = (f"process {index} (host {host}) was given --num_processes {count}, process 0 "
                       f"--num_processes {self.count}")
        elif index == 0:
            problem = f"two processes were given --process_index 0: one on host {socket.gethostname()} (the first " \
                      f"to start) and one on host {host}"
        elif index in self.joined:
            problem = f"two processes were given --process_index {index}: on host {self.joined[index][1]} and on " \
                      f"host {host}"
        if problem:
            error = UserInputError(f"Refused: {problem}. Give every process the same --num_processes and its own "
                                   f"--process_index, 0 to {self.count - 1}, then start them all again.")
            _send(conn, {"error": str(error)})
            conn.close()
            raise error
        self.joined[index] = (conn, host)
        _send(conn, {"ack": True, "waiting": self.missing()})
        log.info("Process %d of %d (host %s) arrived.", index, self.count, host)

    def _drop_gone(self) -> None:
        """Forget the processes that left while waiting (their own deadline passed, or they were stopped)."""
        for index, (conn, host) in list(self.joined.items()):
            readable, _, _ = select.select([conn], [], [], 0)
            try:
                gone = bool(readable) and not conn.recv(1, socket.MSG_PEEK)
            except OSError:
                gone = True
            if gone:
                conn.close()
                del self.joined[index]
                log.warning("Process %d of %d (host %s) left before every process arrived.", index, self.count, host)

    def _port_taken(self, exc: OSError) -> None:
        """The coordinator's port cannot be bound: another process 0 of this launch holds it, or another program."""
        try:
            with socket.create_connection((self.host, self.port), timeout=ANSWER_SECONDS) as conn:
                _send(conn, self._hello())
                reply = _read(conn, ANSWER_SECONDS)
        except OSError:
            reply = None
        if reply and reply.get("error"):
            raise UserInputError(reply["error"])
        raise UserInputError(
            f"Port {self.port} of --coordinator_address {self.address} is taken on this host ({exc.strerror}): "
            "another program holds it. Stop that program, or give every process another port in "
            "--coordinator_address.")

    # -- the others -------------------------------------------------------------------------------
    def _hello(self) -> dict:
        return {"magic": MAGIC, "index": self.index, "count": self.count, "host": socket.gethostname()}

    def follow(self) -> None:
        said = -math.inf
        while True:
            if time.time() >= self.deadline:
                raise UserInputError(
                    f"Process 0 of {self.count} (the coordinator) did not arrive at {self.address} within "
                    f"{self.within}: start the same train command with --process_index 0 on the host of "
                    "--coordinator_address, check that the address is reachable from here, then run this one again.")
            if time.time() - said >= SAY_EVERY_SECONDS:
                log.warning("Process %d of %d: waiting for process 0 of %d at %s, %s.", self.index, self.count,
                            self.count, self.address, self.until)
                said = time.time()
            try:
                conn = socket.create_connection((self.host, self.port), timeout=ANSWER_SECONDS)
            except OSError:
                time.sleep(POLL_SECONDS)
                continue
            with conn:
                _send(conn, self._hello())
                reply = _read(conn, ANSWER_SECONDS)
                if not reply or reply is CLOSED:
                    raise UserInputError(
                        f"{self.address} answers, but not as tpu-pretrain's process 0: another program holds port "
                        f"{self.port} there. Stop it, or give every process another port in --coordinator_address.")
                self._wait_for_go(conn, reply)
                return

    def _wait_for_go(self, conn: socket.socket, reply: dict) -> None:
        """Process 0 answered: wait, up to this process's deadline, until it says every process has come."""
        said = -math.inf
        while True:
            if reply.get("error"):
                raise UserInputError(reply["error"])
            if reply.get("go"):
                return
            waiting = reply.get("waiting") or []
            if waiting and time.time() - said >= SAY_EVERY_SECONDS:
                log.warning("Process %d of %d: process 0 at %s answered; waiting for process(es) %s, %s.",
                            self.index, self.count, self.address, ", ".join(map(str, waiting)), self.until)
                said = time.time()
            left = self.deadline - time.time()
            if left <= 0:
                raise UserInputError(
                    f"Process(es) {', '.join(map(str, waiting))} of {self.count} did not arrive at {self.address} "
                    f"within {self.within}: start the same train command on each with its own --process_index, "
                    "then run this one again.")
            reply = _read(conn, min(left, SAY_EVERY_SECONDS))
            if reply is CLOSED:
                raise UserInputError(f"Process 0 at {self.address} stopped before every process arrived (see its "
                                     "log): run the same command on every process again.")
            reply = reply or {"waiting": waiting}


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the other end is gone: what it would have been told no longer matters


def _read(conn: socket.socket, seconds: float) -> dict | None:
    """One JSON line within ``seconds`` (and no more: a later line stays for the next read); None when none comes
    or it is not ours, :data:`CLOSED` when the other end closed."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(min(left, POLL_SECONDS))
        try:
            waiting = conn.recv(65536, socket.MSG_PEEK)
        except TimeoutError:
            continue
        except OSError:
            return CLOSED
        if not waiting:
            return CLOSED
        if b"\n" in waiting:
            break
        if len(waiting) >= 65536:
            return None
        time.sleep(0.05)  # half a line: the rest is on its way
    line = conn.recv(waiting.index(b"\n") + 1)
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
