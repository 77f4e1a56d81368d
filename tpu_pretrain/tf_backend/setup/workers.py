"""Several training machines: who they are (``--worker_hosts``/``--task_index``, or ``TF_CONFIG``), checked, and
the wait until every one of them is up.

Why a wait of our own: TensorFlow's MultiWorkerMirroredStrategy waits for missing workers inside C++ that holds
the interpreter, so a chief whose other worker never comes says nothing, never gives up and ignores SIGTERM and
Ctrl-C. Here each worker first listens on its own port and waits, in plain Python, until every other worker's
port answers (its listener, or its TensorFlow server once it has gone on): the missing ones are named, the
wait ends after ``worker_wait_minutes``, and a signal stops it. No framework is imported.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import dataclass

from ...environment import environment_override
from ...errors import UserInputError
from ...formatting import hms
from ...runtime import sigterm_as_interrupt

log = logging.getLogger(__name__)
TF_CONFIG_HELP = "see README, 'Training on several machines'"


@dataclass(frozen=True)
class Workers:
    """The training machines, the chief (task 0) first, and this process's place among them."""

    addresses: tuple[str, ...]
    index: int
    source: str  # "--worker_hosts" or "TF_CONFIG"

    @property
    def others(self) -> list[tuple[int, str]]:
        return [(i, a) for i, a in enumerate(self.addresses) if i != self.index]


def find_workers(worker_hosts: str = "", task_index: int = 0, tf_config: str | None = None) -> Workers | None:
    """The machines named by the flags, else by ``TF_CONFIG``; None for one machine. Malformed: a message."""
    if worker_hosts:
        workers = _from_flags(worker_hosts, task_index)
    else:
        text = tf_config if tf_config is not None else environment_override("TF_CONFIG")
        if not text:
            return None
        workers = _from_tf_config(text)
    return workers if len(workers.addresses) > 1 else None


def _check_address(address: str, where: str) -> str:
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserInputError(f"{where}: {address.strip()!r} is not host:port (e.g. 10.0.0.2:12345); every worker "
                             "needs the port it listens on.")
    return address.strip()


def _from_flags(worker_hosts: str, task_index: int) -> Workers:
    addresses = tuple(_check_address(a, "--worker_hosts") for a in worker_hosts.split(","))
    if len(set(addresses)) != len(addresses):
        raise UserInputError(f"--worker_hosts {worker_hosts} names a worker twice: give each machine's host:port once.")
    if not 0 <= task_index < len(addresses):
        raise UserInputError(f"--task_index {task_index} is not one of the {len(addresses)} --worker_hosts "
                             f"(0 to {len(addresses) - 1}; 0 is the chief).")
    return Workers(addresses, task_index, "--worker_hosts")


def _from_tf_config(text: str) -> Workers:
    """TensorFlow's cluster description, checked in full: ``{"cluster": {"chief": [...], "worker": [...]},
    "task": {"type": "worker", "index": 0}}`` (the chief, if any, is task 0)."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise UserInputError(f"TF_CONFIG is not JSON ({exc}); {TF_CONFIG_HELP}.") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise UserInputError('TF_CONFIG needs a "cluster" mapping of job names to host:port lists and a "task" '
                             f'mapping with "type" and "index"; {TF_CONFIG_HELP}.')
    jobs = {}
    for job in ("chief", "worker"):
        hosts = cluster.get(job, [])
        if not isinstance(hosts, list):
            raise UserInputError(f'TF_CONFIG cluster "{job}" must be a list of host:port; it is {hosts!r}.')
        jobs[job] = [_check_address(str(h), f'TF_CONFIG cluster "{job}"') for h in hosts]
    other = sorted(set(cluster) - set(jobs) - {"evaluator"})  # an evaluator task takes no part in training
    if other:
        raise UserInputError(f"TF_CONFIG names jobs {', '.join(other)}: this tool trains with chief and worker "
                             f"tasks only (MultiWorkerMirroredStrategy); {TF_CONFIG_HELP}.")
    kind, index = task.get("type"), task.get("index")
    if kind not in jobs or not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(jobs[kind]):
        raise UserInputError(f'TF_CONFIG task {task!r} is not one of the cluster\'s tasks: "type" must be chief or '
                             f'worker, "index" a number from 0 to the count of that job minus one; {TF_CONFIG_HELP}.')
    return Workers(tuple(jobs["chief"] + jobs["worker"]), index + (len(jobs["chief"]) if kind == "worker" else 0),
                   "TF_CONFIG")


def wait_for_workers(workers: Workers, timeout_seconds: float, poll_seconds: float = 0.5) -> None:
    """Listen on this worker's port until every other worker's port answers; give up after ``timeout_seconds``."""
    port = int(workers.addresses[workers.index].rpartition(":")[2])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as exc:
        listener.close()
        raise UserInputError(f"Port {port} of this worker ({workers.addresses[workers.index]}, task "
                             f"{workers.index}) cannot be used ({exc.strerror}): is another worker or an earlier run "
                             "still holding it?") from None
    listener.listen(64)  # never accepted: a connection that completes is all another worker asks
    started, said = time.monotonic(), -60.0
    try:
        with sigterm_as_interrupt():
            while missing := [(i, a) for i, a in workers.others if not _answers(a)]:
                waited = time.monotonic() - started
                names = ", ".join(f"{a} (task {i})" for i, a in missing)
                if waited >= timeout_seconds:
                    raise UserInputError(
                        f"Worker(s) {names} did not start within {hms(timeout_seconds)} (worker_wait_minutes): "
                        f"start the same train command on each of them with its own --task_index, check the "
                        f"addresses in {workers.source} and that the ports are reachable, then run this one again.")
                if waited - said >= 60:
                    log.warning("Waiting for worker(s) %s to start (task %d of %d; giving up after %s; Ctrl-C or "
                                "SIGTERM stops).", names, workers.index, len(workers.addresses), hms(timeout_seconds))
                    said = waited
                time.sleep(poll_seconds)
    finally:
        listener.close()
    log.info("All %d workers are up.", len(workers.addresses))


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except OSError:
        return False


