"""Faults a user meets while training, through the real command line: a run that diverges, damaged checkpoints,
two trainings on one folder, the wrong vocab, too little data, a corrupt shard, a stop request; and in every
one of them, none of TensorFlow's start-up noise."""

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)

import tensorflow as tf  # isort: skip

from fault_injection import sample_data

# Lines TensorFlow's C++ start-up and Python logging used to print on every run (never the user's business).
NOISE = re.compile(r"absl::InitializeLog|Could not find cuda drivers|failed call to cuInit|oneDNN custom operations"
                   r"|Sharding callback duration|Unable to register cu")
STOPPED_EARLY = 75


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return Path(sample_data(tmp_path_factory.mktemp("faults_data"), workers=1))


def train_args(data_dir, run, steps=8, *extra):
    return [sys.executable, "-m", "tpu_pretrain", "train", "--data_dir", str(data_dir), "--output_dir", str(run),
            "--model_size", "L2-H128", "--train_batch_size", "8", "--num_train_steps", str(steps),
            "--num_warmup_steps", "2", "--save_checkpoints_steps", "2", "--log_every_steps", "2",
            "--eval_every_steps", "0", "--max_eval_steps", "1", "--steps_per_execution", "1",
            "--session_hours", "-1", *extra]


def run_train(data_dir, run, steps=8, *extra, timeout=300):
    """The real command; whatever it says, never a traceback and none of TensorFlow's start-up noise."""
    done = subprocess.run(train_args(data_dir, run, steps, *extra), capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not NOISE.search(done.stderr + done.stdout), done.stderr[-3000:]
    return done


def status(run):
    return subprocess.run([sys.executable, "-m", "tpu_pretrain", "status", str(run)], capture_output=True, text=True,
                          timeout=120, check=True).stdout


def checkpoint_steps(run):
    return sorted(int(p.name.split("-")[1]) for p in (Path(run) / "checkpoints").glob("ckpt-*"))


def test_a_diverging_run_stops_before_saving_and_keeps_the_good_checkpoints(data_dir, tmp_path):
    """Fault injection: a learning rate of 1000 without clipping; the loss turns NaN after a few good checkpoints."""
    run = tmp_path / "run"
    done = run_train(data_dir, run, 40, "--learning_rate", "1000", "--clip_norm", "0", "--num_warmup_steps", "20",
                     "--keep_checkpoint_max", "2", "--log_every_steps", "1")
    assert done.returncode == 2, done.stderr[-3000:]
    message = done.stderr
    match = re.search(r"Training diverged at step (\d+): (a loss of nan|weights or optimizer moments)", message)
    assert match, message[-3000:]
    assert "--learning_rate (now 1000)" in message and "--clip_norm (now 0" in message
    assert "--num_warmup_steps" in message and "--mixed_precision float32" in message
    steps = checkpoint_steps(run)
    assert steps and max(steps) < int(match.group(1)) and len(steps) == 2  # the good ones, not pruned away
    assert f"ckpt-{max(steps):09d}" in message
    for step in steps:
        reader = tf.train.load_checkpoint(str(run / "checkpoints" / f"ckpt-{step:09d}" / "state"))
        for name in reader.get_variable_to_shape_map():
            value = reader.get_tensor(name)
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                assert np.isfinite(value).all(), (step, name)


def test_when_every_checkpoint_is_damaged_training_refuses_and_names_them(data_dir, tmp_path):
    run = tmp_path / "run"
    done = run_train(data_dir, run, 4)
    assert done.returncode == 0 and "Trained to step 4" in done.stdout
    assert "Saved checkpoint" in done.stderr  # our own progress stays when TensorFlow's noise goes
    for data in (run / "checkpoints").glob("ckpt-*/state.data-*"):
        data.write_bytes(b"\0" * data.stat().st_size)  # sizes intact; the CRC32C differs
    before = {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()}

    refused = run_train(data_dir, run, 8)
    assert refused.returncode == 2
    assert "ckpt-000000004" in refused.stderr and "ckpt-000000002" in refused.stderr
    assert "--set_aside_damaged_checkpoints" in refused.stderr
    assert {p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()} == before
    status = subprocess.run([sys.executable, "-m", "tpu_pretrain", "status", str(run)], capture_output=True,
                            text=True, timeout=120)
    assert "no checkpoint yet" not in status.stdout
    assert "damaged checkpoints: ckpt-000000004" in status.stdout and "refuses" in status.stdout

    started_over = run_train(data_dir, run, 4, "--set_aside_damaged_checkpoints")
    assert started_over.returncode == 0, started_over.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints" / "damaged").iterdir()) == ["ckpt-000000002",
                                                                                  "ckpt-000000004"]
    assert checkpoint_steps(run) == [2, 4]


def test_two_trainings_on_one_folder_are_refused_and_a_dead_holder_is_taken_over(data_dir, tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen(train_args(data_dir, run, 100_000), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not checkpoint_steps(run) and time.time() < deadline and first.poll() is None:
            time.sleep(0.2)
        assert checkpoint_steps(run), "the first training never saved"
        second = run_train(data_dir, run, 100_000, timeout=120)
        assert second.returncode == 2
        assert f"pid {first.pid} on host {socket.gethostname()}" in second.stderr
        assert (run / "train.lock").is_file() and first.poll() is None  # the first goes on, undisturbed
        assert f"trainer: running, pid {first.pid} on host {socket.gethostname()}, since " in status(run)
    finally:
        first.kill()
        first.wait()
    assert f"trainer: none running (the lock {run / 'train.lock'} is left from one that stopped: process " \
           f"{first.pid} is no longer running" in status(run)
    # SIGKILL left the lock behind: the next start sees its holder is gone, says so, and trains.
    third = run_train(data_dir, run, checkpoint_steps(run)[-1] + 2)
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"Took over the lock {run / 'train.lock'} from pid {first.pid}" in third.stderr
    assert "is no longer running" in third.stderr
    assert not (run / "train.lock").exists()  # released at the end


def test_a_vocab_of_the_same_size_in_another_order_is_refused(data_dir, tmp_path):
    tokens = (data_dir / "vocab.txt").read_text().splitlines()
    tokens[200], tokens[201] = tokens[201], tokens[200]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    done = run_train(data_dir, tmp_path / "run", 4, "--vocab_file", str(tmp_path / "vocab.txt"))
    assert done.returncode == 2
    assert f"line 201 is {tokens[200]!r} here and {tokens[201]!r}" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_data_with_less_than_a_batch_is_refused_at_once(data_dir, tmp_path):
    from pretraining_fixtures import write_shards, write_vocab

    empty = tmp_path / "empty"
    write_shards(str(empty), {"train": [], "eval": []}, 64, 10, 100)
    write_vocab(str(empty / "vocab.txt"), 100)
    started = time.time()
    done = run_train(empty, tmp_path / "run", 4, timeout=120)
    assert done.returncode == 2 and "holds 0 training instances, fewer than one batch" in done.stderr
    instances = json.loads((data_dir / "manifest.json").read_text())["totals"]["train"]["instances"]
    done = run_train(data_dir, tmp_path / "run", 4, "--train_batch_size", str(instances + 8), timeout=120)
    assert done.returncode == 2 and f"holds {instances} training instances" in done.stderr
    assert time.time() - started < 100  # refused, not spinning


def test_a_corrupt_shard_is_named(data_dir, tmp_path):
    truncated = tmp_path / "truncated"
    shutil.copytree(data_dir, truncated)
    shard = truncated / "train-00001-of-00003.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-100])
    done = run_train(truncated, tmp_path / "run1", 4)
    assert done.returncode == 2 and "train-00001-of-00003.tfrecord" in done.stderr
    assert "truncated or were replaced" in done.stderr

    flipped = tmp_path / "flipped"
    shutil.copytree(data_dir, flipped)
    for name in ("train-00000-of-00003.tfrecord", "train-00001-of-00003.tfrecord", "train-00002-of-00003.tfrecord"):
        raw = bytearray((flipped / name).read_bytes())
        raw[len(raw) // 2:len(raw) // 2 + 64] = bytes(64)  # same size, damaged records
        (flipped / name).write_bytes(bytes(raw))
    done = run_train(flipped, tmp_path / "run2", 200)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "is corrupt" in done.stderr and "train-00000-of-00003.tfrecord" in done.stderr


def test_a_stop_request_exits_75_so_that_a_chain_stops(data_dir, tmp_path):
    run = tmp_path / "run"
    process = subprocess.Popen(train_args(data_dir, run, 100_000), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.time() + 240
    while not checkpoint_steps(run) and time.time() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=240)
    assert process.returncode == STOPPED_EARLY, err[-3000:]
    assert "Stopped early (SIGTERM received)" in out and "exit code 75" in out and "Traceback" not in err
    assert not (run / "train.lock").exists()
    short = "--session_hours 0.00001 --session_margin_minutes 0"  # over at once (a longer margin is refused)
    chained = subprocess.run(f"{' '.join(train_args(data_dir, run, 100_000))} {short} && touch "
                             f"{tmp_path / 'exported'}", shell=True, capture_output=True, text=True, timeout=300)
    assert chained.returncode == STOPPED_EARLY and not (tmp_path / "exported").exists()
