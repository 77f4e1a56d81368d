"""Several JAX processes through the real command line, where they cannot train together: every wait says what it
waits for and until when and ends by ``--worker_wait_minutes`` naming the missing process; SIGTERM ends a wait with
the tool's message; two processes given one index, a coordinator port another program holds, an address with a
scheme and settings that differ between the processes are refused by name. Every wait here is bounded."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from fault_injection import sample_data
from test_multiprocess import command, environment, free_port

WAIT = ("--worker_wait_minutes", "0.1")  # 6 s
ENDS_WITHIN = 120  # seconds: JAX's import on a busy CI machine, and the 6 s wait


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("waits"), max_chars=20_000, num_shards=1, workers=1)


def launch(data_dir: str, run: Path, port: int, index: int, *extra: str, name: str = "") -> tuple:
    several = ("--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2", "--process_index", str(index))
    log = open(f"{run}.{name or index}.log", "w+")  # noqa: SIM115 - read back when the process has ended
    process = subprocess.Popen(command(data_dir, run, *several, *extra), stdout=log, stderr=subprocess.STDOUT,
                               env=environment(1))
    return process, log


def said(started: tuple, within: float = ENDS_WITHIN) -> tuple[int, str]:
    """The exit status and output of a process, once it has ended (killed if it has not within ``within`` s)."""
    process, log = started
    try:
        process.wait(timeout=within)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.seek(0)
    text = log.read()
    log.close()
    return process.returncode, text


def wait_for(started: tuple, text: str, within: float = ENDS_WITHIN) -> None:
    deadline = time.monotonic() + within
    while started[0].poll() is None and time.monotonic() < deadline:
        started[1].seek(0)
        if text in started[1].read():
            return
        time.sleep(0.2)
    started[1].seek(0)
    raise AssertionError(f"{text!r} not said: {started[1].read()[-3000:]}")


def clean(output: str) -> bool:
    return all(sign not in output for sign in ("Traceback", "SIGABRT", "Fatal Python", "*** Begin stack trace"))


def test_a_process_whose_peer_never_comes_says_what_it_waits_for_until_when_and_names_it(data, tmp_path):
    ports = free_port(), free_port(), free_port()
    alone = launch(data, tmp_path / "chief", ports[0], 0, *WAIT)
    follower = launch(data, tmp_path / "follower", ports[1], 1, *WAIT)
    stopped = launch(data, tmp_path / "stopped", ports[2], 0, "--worker_wait_minutes", "5")
    wait_for(stopped, "waiting for process 1 of 2")
    stopped[0].send_signal(signal.SIGTERM)
    code, output = said(stopped, 30)
    assert code not in (0, -signal.SIGTERM), output[-3000:]
    assert "Process 0 of 2 stopped while waiting for process 1 of 2 at 127.0.0.1:" in output, output[-3000:]
    assert "interrupted" in output and clean(output), output[-3000:]

    code, output = said(alone)
    assert code != 0, output[-3000:]
    assert f"Process 0 of 2: waiting for process 1 of 2 at 127.0.0.1:{ports[0]}, giving up at " in output
    assert "(--worker_wait_minutes 0.1)" in output, output[-3000:]
    assert f"Process 1 of 2 did not arrive at 127.0.0.1:{ports[0]} within 0:00:06 (--worker_wait_minutes)" in output
    assert clean(output), output[-3000:]

    code, output = said(follower)
    assert code != 0, output[-3000:]
    assert f"Process 1 of 2: waiting for process 0 of 2 at 127.0.0.1:{ports[1]}, giving up at " in output
    assert f"Process 0 of 2 (the coordinator) did not arrive at 127.0.0.1:{ports[1]} within 0:00:06" in output
    assert clean(output), output[-3000:]


def test_two_processes_given_the_same_index_are_refused_by_name(data, tmp_path):
    port = free_port()
    first = launch(data, tmp_path / "run", port, 0, "--worker_wait_minutes", "1", name="first")
    wait_for(first, "waiting for process 1 of 2")
    second = launch(data, tmp_path / "run", port, 0, "--worker_wait_minutes", "1", name="second")
    for started in (second, first):
        code, output = said(started)
        assert code != 0, output[-3000:]
        assert "Refused: two processes were given --process_index 0" in output, output[-3000:]
        assert clean(output), output[-3000:]


def test_a_coordinator_port_another_program_holds_is_named_and_the_follower_does_not_wait_silently(data, tmp_path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(8)
        port = other.getsockname()[1]
        chief = launch(data, tmp_path / "run", port, 0, *WAIT)
        follower = launch(data, tmp_path / "run", port, 1, *WAIT)
        code, output = said(chief)
        assert code != 0 and clean(output), output[-3000:]
        assert f"Port {port} of --coordinator_address 127.0.0.1:{port} is taken on this host" in output
        assert "another port in --coordinator_address" in output, output[-3000:]
        code, output = said(follower)
        assert code != 0 and clean(output), output[-3000:]
        assert f"127.0.0.1:{port} answers, but not as tpu-pretrain's process 0: another program holds port" in output


def test_a_coordinator_address_with_a_scheme_is_refused_with_the_form_expected(data, tmp_path):
    done = subprocess.run(command(data, tmp_path / "run", "--coordinator_address", "http://127.0.0.1:1234",
                                  "--num_processes", "2", "--process_index", "1"),
                          capture_output=True, text=True, env=environment(1), timeout=ENDS_WITHIN)
    assert done.returncode != 0
    assert "coordinator_address='http://127.0.0.1:1234' is invalid: give process 0's HOST:PORT alone, no scheme" \
        in done.stderr, done.stderr[-3000:]


def test_processes_given_different_settings_are_refused_naming_the_process_and_the_setting(data, tmp_path):
    port = free_port()
    chief = launch(data, tmp_path / "run", port, 0, "--worker_wait_minutes", "1")
    follower = launch(data, tmp_path / "run", port, 1, "--worker_wait_minutes", "1", "--train_batch_size", "16")
    for started in (chief, follower):
        code, output = said(started)
        assert code != 0 and clean(output), output[-3000:]
        assert "process 1 was given --train_batch_size 16, process 0 --train_batch_size 8" in output, output[-3000:]
        assert "Every process must be given the same settings" in output
    assert not list((tmp_path / "run").glob("checkpoints/ckpt-*"))
