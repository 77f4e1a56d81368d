"""Several machines as careless users set them up (issue 24): a chief whose other worker never comes waits with a
word, gives up in time and stops on SIGTERM or Ctrl-C; malformed --worker_hosts, --task_index and TF_CONFIG are
refused with what is wrong; the JAX backend refuses to train "alone" on a cluster. No framework is imported."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tpu_pretrain.cli import main
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.tf_backend.setup.workers import Workers, find_workers, wait_for_workers


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.parametrize("hosts, index, says", [
    ("h:1,h", 0, "'h' is not host:port"),
    ("h:1,h:http", 0, "'h:http' is not host:port"),
    ("h:1,h:2", 7, "--task_index 7 is not one of the 2 --worker_hosts (0 to 1"),
    ("h:1,h:1", 0, "names a worker twice"),
    ("h:1,,h:2", 0, "'' is not host:port"),
])
def test_malformed_worker_hosts_are_refused_with_what_is_wrong(hosts, index, says):
    with pytest.raises(UserInputError) as caught:
        find_workers(hosts, index)
    assert says in str(caught.value)


@pytest.mark.parametrize("tf_config, says", [
    ({"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker"}}, "is not one of the cluster's tasks"),
    ({"cluster": ["h:1", "h:2"], "task": {"type": "worker", "index": 0}}, 'needs a "cluster" mapping'),
    ({"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 7}}, "is not one of the cluster"),
    ({"cluster": {"worker": ["h:1", "h"]}, "task": {"type": "worker", "index": 0}}, "'h' is not host:port"),
    ({"cluster": {"worker": "h:1,h:2"}, "task": {"type": "worker", "index": 0}}, "must be a list of host:port"),
    ({"cluster": {"worker": ["h:1"], "ps": ["h:3"]}, "task": {"type": "worker", "index": 0}}, "names jobs ps"),
    ("{not json", "TF_CONFIG is not JSON"),
])
def test_malformed_tf_config_is_refused_through_the_command_line(tf_config, says, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("TF_CONFIG", tf_config if isinstance(tf_config, str) else json.dumps(tf_config))
    code = main(["train", "--backend", "tensorflow", "--data_dir", str(tmp_path), "--output_dir",
                 str(tmp_path / "run"), "--model_size", "L2-H128"])
    err = capsys.readouterr().err
    assert code == 2 and says in err, err


def test_tf_config_orders_the_chief_first():
    config = {"cluster": {"worker": ["w:1", "w:2"], "chief": ["c:1"], "evaluator": ["e:1"]},
              "task": {"type": "worker", "index": 1}}
    assert find_workers(tf_config=json.dumps(config)) == Workers(("c:1", "w:1", "w:2"), 2, "TF_CONFIG")
    assert find_workers("a:1", 0) is None  # one machine


def test_the_jax_backend_refuses_several_machines(monkeypatch, capsys, tmp_path):
    pytest.importorskip("jax")
    args = ["train", "--backend", "jax", "--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "run"),
            "--model_size", "L2-H128"]
    assert main([*args, "--worker_hosts", "a:1,b:2", "--task_index", "0"]) == 2
    assert ("worker_hosts='a:1,b:2' (training on several machines with TensorFlow's workers) is offered by the "
            "tensorflow backend, not jax") in " ".join(capsys.readouterr().err.split())
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    assert main(args) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "TF_CONFIG describes 2 machines, but the jax backend does not read TensorFlow's workers (it trains on " \
        "several processes with JAX's runtime: --coordinator_address" in said
    assert not (tmp_path / "run").exists()


def test_a_missing_worker_is_named_and_the_wait_ends():
    mine, missing = free_ports(2)
    workers = Workers((f"127.0.0.1:{mine}", f"127.0.0.1:{missing}"), 0, "--worker_hosts")
    started = time.monotonic()
    with pytest.raises(UserInputError, match=rf"Worker\(s\) 127.0.0.1:{missing} \(task 1\) did not start within "
                                             r"0:00:01 \(worker_wait_minutes\)"):
        wait_for_workers(workers, timeout_seconds=1.5, poll_seconds=0.1)
    assert 1.5 <= time.monotonic() - started < 10

    # the other worker comes: its port answers (as its own wait's listener does), and the wait ends at once
    other = socket.create_server(("127.0.0.1", missing))
    try:
        started = time.monotonic()
        wait_for_workers(workers, timeout_seconds=60)
        assert time.monotonic() - started < 5
    finally:
        other.close()
    with socket.create_server(("", mine)):  # this worker's own port taken: said so, not a hang
        with pytest.raises(UserInputError, match=f"Port {mine} of this worker .* cannot be used"):
            wait_for_workers(workers, timeout_seconds=60)


def test_ctrl_c_stops_the_wait():
    workers = Workers(tuple(f"127.0.0.1:{p}" for p in free_ports(2)), 0, "--worker_hosts")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even where this test
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))  # runs as a background job
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            wait_for_workers(workers, timeout_seconds=60, poll_seconds=0.05)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 10


def test_a_chief_waiting_for_its_worker_says_so_and_stops_on_sigterm(tmp_path):
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    process = subprocess.Popen(
        [sys.executable, "-m", "tpu_pretrain", "train", "--backend", "tensorflow", "--data_dir", str(tmp_path),
         "--output_dir", str(tmp_path / "run"), "--model_size", "L2-H128", "--worker_hosts", hosts, "--task_index",
         "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.time() + 120
    while time.time() < deadline:
        line = process.stderr.readline()
        lines.append(line)
        if "Waiting for worker(s)" in line or not line:
            break
    assert f"Waiting for worker(s) {hosts.split(',')[1]} (task 1) to start" in lines[-1], "".join(lines)[-3000:]
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err[-3000:]
    assert "interrupted" in err and "Traceback" not in err
