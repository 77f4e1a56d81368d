"""Two worker processes on loopback with MultiWorkerMirroredStrategy (the real CLI, --worker_hosts): one of them
SIGKILLed after a checkpoint, both started again, they resume from the chief's last checkpoint and end with the
weights of one process trained with the same global batch."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fault_injection import ENV as FAULT_ENV
from fault_injection import sample_data

import tensorflow as tf  # isort: skip

STEPS = 12
ENV = {key: value for key, value in FAULT_ENV.items() if key != "TF_CONFIG"}  # the workers are given theirs


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The sample data, and beside it the config of a one-layer BERT (hidden 64) that every process trains: what
    is checked is the workers' agreement, and each process's build and compile are the cost."""
    root = tmp_path_factory.mktemp("multi_worker_data")
    (root / "bert_config.json").write_text(json.dumps(
        {"vocab_size": 1500, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "intermediate_size": 128, "max_position_embeddings": 64}))
    return sample_data(root, max_chars=60_000, num_shards=2, workers=1)


def command(data_dir, run, *extra):
    return [sys.executable, "-m", "tpu_pretrain", "train", "--data_dir", data_dir, "--output_dir", str(run),
            "--bert_config_file", str(Path(data_dir).parent / "bert_config.json"), "--train_batch_size", "8",
            "--num_train_steps", str(STEPS),
            "--num_warmup_steps", "4", "--learning_rate", "1e-3", "--save_checkpoints_steps", "4",
            "--log_every_steps", "4", "--eval_every_steps", "0", "--max_eval_steps", "1", "--steps_per_execution",
            "1", "--hidden_dropout_prob", "0", "--train_seed", "3", "--shuffle_buffer_size", "64",
            "--accelerator", "cpu", "--session_hours", "-1", *extra]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(data_dir, run, logs: Path, attempt: int) -> list[subprocess.Popen]:
    hosts = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    return [subprocess.Popen(command(data_dir, run, "--worker_hosts", hosts, "--task_index", str(task)), env=ENV,
                             stdout=subprocess.DEVNULL, stderr=open(logs / f"worker{task}-{attempt}.log", "w"))
            for task in range(2)]


def variables(run) -> dict:
    reader = tf.train.load_checkpoint(str(Path(run) / "checkpoints" / f"ckpt-{STEPS:09d}" / "state"))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("model/") and "OPTIMIZER_SLOT" not in n]
    return {n: reader.get_tensor(n) for n in names}


def test_two_workers_killed_and_restarted_reach_one_process_weights(data_dir, tmp_path):
    single = subprocess.run(command(data_dir, tmp_path / "single"), env=ENV, capture_output=True, text=True,
                            timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]

    run = tmp_path / "multi"
    workers = start_workers(data_dir, run, tmp_path, 1)
    deadline = time.time() + 300
    while not list((run / "checkpoints").glob("ckpt-*")) and time.time() < deadline:
        assert all(w.poll() is None for w in workers), (tmp_path / "worker0-1.log").read_text()[-3000:]
        time.sleep(0.05)
    workers[1].send_signal(signal.SIGKILL)
    workers[1].wait()
    try:
        workers[0].wait(timeout=20)  # the chief loses its peer: it stops, or waits on it and is stopped here
    except subprocess.TimeoutExpired:
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
    kept = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("ckpt-*"))
    assert kept and kept[-1] < STEPS, f"the kill did not land before the end: {kept}"

    workers = start_workers(data_dir, run, tmp_path, 2)
    for task, worker in enumerate(workers):
        assert worker.wait(timeout=600) == 0, (tmp_path / f"worker{task}-2.log").read_text()[-3000:]
    chief_log = (tmp_path / "worker0-2.log").read_text()
    assert f"step {kept[-1]} of {STEPS}" in chief_log, chief_log[-3000:]
    assert not list(run.glob("checkpoints/*worker*")), "a second writer left files in the run folder"

    expected, got = variables(tmp_path / "single"), variables(run)
    assert expected.keys() == got.keys() and len(expected) > 10
    worst = max(float(np.max(np.abs(got[n] - expected[n]))) for n in expected)
    print(f"two workers (killed at step {kept[-1]}, resumed) vs one process: max abs weight difference {worst:.3g}")
    assert worst < 1e-5
