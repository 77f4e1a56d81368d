"""JAX's multi-process runtime for the JAX backend: joining it, and stopping every process when one is lost.

One program per host (a TPU VM pod's hosts, several GPU machines, or CPU processes in the tests), one mesh over
all their devices. A process that dies (killed, preempted, its host gone) breaks the next collective the others
run (gloo: "Connection reset by peer"), and JAX's coordination service stops every process that still waits on it
within :data:`HEARTBEAT_TIMEOUT_SECONDS`. A survivor that meets the broken collective says so at once, names the
processes that no longer answer a roll call through the coordination service's key-value store, and ends
(:class:`~tpu_pretrain.errors.ProcessLost`) instead of waiting at JAX's shutdown barrier for the lost process.
The same command on every host resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import socket
import time
from typing import Any

import jax

from ..errors import ProcessLost, UserInputError
from ..runtime import in_colab, in_kaggle, tpu_vm_present
from ..settings import TRAIN
from .rendezvous import meet

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_SECONDS = 60  # JAX's default is 100: a lost host stops the others sooner
ROLL_CALL_SECONDS = 10.0  # how long a survivor waits for the others to answer before naming those that did not
_ROLL_CALL = "tpu_pretrain/roll_call/"
_HOSTS = "tpu_pretrain/host/"
_SETTINGS = "tpu_pretrain/settings/"
# train's settings that may differ between processes: which process this is, how it waits and what it reports.
_PER_PROCESS = {"process_index", "coordinator_address", "worker_wait_minutes", "tpu_name", "accelerator",
                "worker_hosts", "task_index", "peak_tflops", "log_example_ids"}
JOIN_SECONDS = 120  # JAX's runtime joining, and the settings compared, once every process has met
# What a collective says when a process it spans is gone (gloo on CPUs; gRPC and the coordination service).
_LOST_SIGNS = ("connection reset", "connection closed", "connection refused", "socket closed", "broken pipe",
               "unavailable", "deadline_exceeded", "heartbeat", "gloo")


def is_chief() -> bool:
    """Whether this process writes the run folder: the only process, or process 0 of several."""
    return jax.process_index() == 0


def join_processes(config) -> int:
    """:func:`start_processes` with a run's settings: its wait (``--worker_wait_minutes``) and what must agree."""
    t = config.train
    return start_processes(t.coordinator_address, t.num_processes, t.process_index, t.worker_wait_minutes,
                           settings_to_agree(config))


def settings_to_agree(config) -> dict[str, Any]:
    """train's settings of the data, the model and the training, and ``--data_dir``: the same on every process
    (not those that say which process this is, how long it waits, or what it reports)."""
    values = {f.name: getattr(section, f.name) for section in (config.data, config.model, config.train)
              for f in dataclasses.fields(section) if TRAIN in f.metadata["steps"] and f.name not in _PER_PROCESS}
    return {**values, "data_dir": config.storage.data_dir}


def start_processes(coordinator_address: str = "", num_processes: int = 0, process_index: int = 0,
                    wait_minutes: float = 10.0, settings: dict[str, Any] | None = None) -> int:
    """Join JAX's multi-process runtime where asked (before any other use of JAX); the number of processes.

    Given the three settings: those processes (on CPU with gloo collectives, as the tests run them), after they
    have met at the coordinator's address in plain Python (:mod:`.rendezvous`, up to ``wait_minutes``). Not given:
    ``jax.distributed.initialize()`` finds its peers by itself on a TPU VM (not Colab's or Kaggle's, which have one
    host) and wherever ``JAX_COORDINATOR_ADDRESS`` is set; else one process. ``num_processes`` 1: this one alone.
    ``settings`` (flag -> value): what every process must have been given alike, compared once they have joined.
    """
    if jax.distributed.is_initialized():
        return jax.process_count()
    auto = not coordinator_address and num_processes == 0 and (
        bool(os.environ.get("JAX_COORDINATOR_ADDRESS")) or (tpu_vm_present() and not (in_colab() or in_kaggle())))
    if num_processes <= 1 and not auto:
        return 1
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices' collectives; others' ignore it
    if not auto:
        meet(coordinator_address, num_processes, process_index, wait_minutes)
    try:
        if auto:
            jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_SECONDS)
        else:  # every process has come: JAX's runtime starts in seconds
            jax.distributed.initialize(coordinator_address, num_processes, process_index,
                                       initialization_timeout=JOIN_SECONDS,
                                       heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_SECONDS)
    except (RuntimeError, ValueError) as exc:
        given = (f"--coordinator_address {coordinator_address} --num_processes {num_processes} --process_index "
                 f"{process_index}" if not auto else "the TPU VM pod's or JAX_COORDINATOR_ADDRESS's settings")
        raise UserInputError(f"JAX's multi-process runtime did not start with {given}: {exc}. Start the same "
                             "command on every process within a few minutes, process 0's address reachable from "
                             "all; or --num_processes 1 to train on this machine alone.") from None
    _client().key_value_set(f"{_HOSTS}{jax.process_index()}", socket.gethostname())
    log.info("JAX process %d of %d (%s). If one process stops, every process stops within %d s; the same command "
             "on every host resumes.", jax.process_index(), jax.process_count(),
             "the chief: writes the run folder" if is_chief() else "follows process 0", HEARTBEAT_TIMEOUT_SECONDS)
    if settings is not None:
        compare_settings(settings)
    return jax.process_count()


def compare_settings(settings: dict[str, Any]) -> None:
    """Refuse, on every process, settings that differ from process 0's: each process trains the one global batch
    with the one model, and a process given another batch size, step count, data or model would train another run
    silently (or stop at a collective the others never reach)."""
    me, count, client = jax.process_index(), jax.process_count(), _client()
    mine = json.dumps(settings, sort_keys=True, default=str)
    client.key_value_set(f"{_SETTINGS}{me}", mine)
    timeout_ms = int(JOIN_SECONDS * 1000)
    try:
        given = {i: json.loads(client.blocking_key_value_get(f"{_SETTINGS}{i}", timeout_ms) if i != me else mine)
                 for i in (range(count) if me == 0 else (0, me))}
    except Exception as exc:  # noqa: BLE001 - a process that stopped before it said its settings
        raise UserInputError(f"Process {me} of {count}: the other processes did not say their settings within "
                             f"{JOIN_SECONDS:.0f} s ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}):"
                             " see their logs, then start the same command on every process again.") from None
    differ = [f"process {i} was given {_flags(given[i], given[0])}, process 0 {_flags(given[0], given[i])}"
              for i in sorted(given) if i and given[i] != given[0]]
    if differ:
        raise UserInputError(f"Process {me} of {count} refuses to train: {'; '.join(differ)}. Every process must be "
                             "given the same settings (only --process_index differs): start the same command on each.")


def _flags(these: dict[str, Any], others: dict[str, Any]) -> str:
    return " ".join(f"--{k} {these.get(k)}" for k in sorted(set(these) | set(others)) if these.get(k) != others.get(k))


def _client():
    from jax._src import distributed  # the coordination service's client: its key-value store has no public API

    return distributed.global_state.client


def spans_processes(method):
    """A trainer method whose work spans every process: when it fails because another process is gone, it raises
    :class:`ProcessLost` naming that process, after saying at once that contact was lost."""

    @functools.wraps(method)
    def watched(trainer, *args, **kwargs):
        try:
            return method(trainer, *args, **kwargs)
        except Exception as exc:
            if trainer.devices.abstract or trainer.devices.processes == 1 or not looks_lost(exc):
                raise
            raise process_lost(exc, _last_step(trainer)) from exc

    return watched


def _last_step(trainer) -> int:
    """The step the trainer's state holds, else the step last read (a failed collective leaves the state unusable)."""
    try:
        return trainer.step
    except Exception:  # noqa: BLE001 - the state came out of the failed computation
        return trainer.last_step


def looks_lost(exc: BaseException) -> bool:
    """Whether an error is what a collective raises when a process it spans is gone (not, say, an out-of-memory)."""
    text = str(exc).lower()
    return any(sign in text for sign in _LOST_SIGNS)


def process_lost(exc: BaseException, step: int) -> ProcessLost:
    """The error to end this process with: what broke, which processes did not answer the roll call, how to
    resume. The first line is logged before the roll call: the coordination service may stop this process first."""
    me, count = jax.process_index(), jax.process_count()
    cause = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    log.error("Process %d of %d lost contact with the other processes after step %d: %s", me, count, step, cause)
    missing, hosts = roll_call(me, count)
    if missing is None:
        who = "process 0 (the coordinator) is gone: the coordination service no longer answers"
    elif missing:
        who = ", ".join(f"process {i}" + (f" (host {hosts[i]})" if hosts.get(i) else "") for i in missing)
        who = f"{who} did not answer within {ROLL_CALL_SECONDS:.0f} s: stopped (killed, preempted or its host lost)"
    else:
        who = "every process answered: one of them failed at this collective (see its log)"
    return ProcessLost(
        f"Process {me} of {count} stopped after step {step}: {who}. The collective failed with: {cause}. Every "
        f"process stops (JAX's runtime ends any still waiting within {HEARTBEAT_TIMEOUT_SECONDS} s). Run the same "
        "command on every host to resume from the newest complete checkpoint.")


def roll_call(me: int, count: int) -> tuple[list[int] | None, dict[int, str]]:
    """Answer the roll call and wait up to :data:`ROLL_CALL_SECONDS` for the others: the processes that did not
    answer (None when the coordination service itself is gone) and every process's host as it registered."""
    client = _client()
    try:
        client.key_value_set(f"{_ROLL_CALL}{me}", "here")
        hosts = {int(k.rsplit("/", 1)[1]): v for k, v in client.key_value_dir_get(_HOSTS)}
        deadline = time.monotonic() + ROLL_CALL_SECONDS
        while True:
            answered = {int(k.rsplit("/", 1)[1]) for k, _ in client.key_value_dir_get(_ROLL_CALL)}
            if len(answered) == count or time.monotonic() > deadline:
                return sorted(set(range(count)) - answered), hosts
            time.sleep(0.2)
    except Exception:  # noqa: BLE001 - the coordination service is process 0's: unreachable means it is gone
        return None, {}
