"""Exact resume: training processes killed with SIGKILL (inside steps and inside checkpoint writes) and
restarted end with the same weights, having seen the same examples, as a run that was never interrupted,
with dropout on (its masks are a function of seed and step, like the data order)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)

import tensorflow as tf  # isort: skip

from tpu_pretrain.config import Config
from tpu_pretrain.data.create import create_pretraining_data
from tpu_pretrain.data.sample_corpus import write_sample_corpus
from tpu_pretrain.data.vocab import build_vocab
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.train.status import run_status

STEPS = 300


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_data")
    corpus = write_sample_corpus(root / "corpus.txt", max_chars=80_000)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=1500, num_unused_tokens=5,
                                    output_dir=str(root)))
    create_pretraining_data(Config.load(input=[str(corpus)], vocab_file=vocab.path, output_dir=str(root / "data"),
                                        max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1,
                                        num_shards=3, eval_fraction=0.05))
    return str(root / "data")


def train_command(data_dir, run_dir, steps=STEPS, extra=()):
    return [sys.executable, "-m", "tpu_pretrain", "train", "--data_dir", data_dir, "--output_dir", str(run_dir),
            "--model_size", "L2-H128", "--train_batch_size", "8", "--num_train_steps", str(steps),
            "--num_warmup_steps", "4", "--learning_rate", "1e-3", "--save_checkpoints_steps", "4",
            "--log_every_steps", "4", "--eval_every_steps", "0", "--max_eval_steps", "1",
            "--steps_per_execution", "1", "--hidden_dropout_prob", "0.1", "--log_example_ids", "--train_seed", "3",
            "--shuffle_buffer_size", "64", "--keep_checkpoint_max", "3", "--session_hours", "-1", *extra]


ENV = {**os.environ, "TF_DETERMINISTIC_OPS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def final_variables(run_dir, step=STEPS):
    reader = tf.train.load_checkpoint(str(Path(run_dir) / "checkpoints" / f"ckpt-{step:09d}" / "state"))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("model/") and "OPTIMIZER_SLOT" not in n]
    return {n: reader.get_tensor(n) for n in names}


def example_ids_by_step(run_dir):
    """Every logged (step -> ids), checking that a step replayed after a crash used the same examples."""
    seen = {}
    for line in (Path(run_dir) / "logs" / "example_ids.jsonl").read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line cut by SIGKILL
            continue
        if entry["step"] in seen:
            assert seen[entry["step"]] == entry["ids"], f"step {entry['step']} replayed with other examples"
        seen[entry["step"]] = entry["ids"]
    return seen


@pytest.mark.slow
def test_sigkilled_training_resumes_to_the_same_weights_and_examples(data_dir, tmp_path):
    reference = tmp_path / "reference"
    done = subprocess.run(train_command(data_dir, reference), env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    run = tmp_path / "interrupted"
    rng = random.Random(20261122)
    kills = {"step": 0, "checkpoint write": 0}
    for attempt in range(12):
        if sum(kills.values()) >= 6:
            break
        mode = "checkpoint write" if attempt % 2 else "step"
        process = subprocess.Popen(train_command(data_dir, run), env=ENV, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        ids_log = run / "logs" / "example_ids.jsonl"
        start_size = ids_log.stat().st_size if ids_log.exists() else 0
        deadline = time.time() + 300
        killed = False
        while process.poll() is None and time.time() < deadline:
            if mode == "step" and ids_log.exists() and ids_log.stat().st_size > start_size:
                time.sleep(rng.uniform(0.0, 0.5))  # somewhere among the next steps
                killed = process.poll() is None
            elif mode == "checkpoint write" and list((run / "checkpoints").glob(".ckpt-*.tmp-*")):
                killed = process.poll() is None  # a checkpoint folder is being written right now
            if killed:
                process.send_signal(signal.SIGKILL)
                process.wait()
                kills[mode] += 1
                break
            time.sleep(0.002)
        if not killed:
            process.wait()
            break  # it finished before it could be killed
    print("kills:", kills)
    assert kills["step"] >= 3 and kills["checkpoint write"] >= 2, kills
    assert not (run / "checkpoints" / f"ckpt-{STEPS:09d}").exists()
    final = subprocess.run(train_command(data_dir, run), env=ENV, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]

    expected, got = final_variables(reference), final_variables(run)
    assert expected.keys() == got.keys() and len(expected) > 10
    worst = max(float(np.max(np.abs(got[n] - expected[n]))) for n in expected)
    print(f"max abs weight difference after {sum(kills.values())} SIGKILLs: {worst:.3g}")
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-6, rtol=0, err_msg=name)
    reference_ids, resumed_ids = example_ids_by_step(reference), example_ids_by_step(run)
    assert sorted(resumed_ids) == list(range(1, STEPS + 1))
    assert resumed_ids == reference_ids  # the same examples at every step: none repeated, none skipped


def test_a_resumed_run_draws_the_same_dropout_masks(data_dir, tmp_path):
    """Dropout on; a constant learning rate, so that stopping at 6 of 12 steps changes nothing but the stop."""
    from tpu_pretrain.train.loop import train

    settings = dict(data_dir=data_dir, model_size="L2-H128", train_batch_size=8, num_warmup_steps=0,
                    learning_rate=1e-3, end_learning_rate=1e-3, save_checkpoints_steps=6, eval_every_steps=0,
                    max_eval_steps=1, hidden_dropout_prob=0.1, train_seed=3, shuffle_buffer_size=64)
    train(Config.load(output_dir=str(tmp_path / "whole"), num_train_steps=12, **settings), progress=False)
    train(Config.load(output_dir=str(tmp_path / "resumed"), num_train_steps=6, **settings), progress=False)
    train(Config.load(output_dir=str(tmp_path / "resumed"), num_train_steps=12, **settings), progress=False)
    expected, got = final_variables(tmp_path / "whole", 12), final_variables(tmp_path / "resumed", 12)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-6, rtol=0, err_msg=name)


def test_status_and_continuing_with_safe_and_unsafe_changes(data_dir, tmp_path):
    from tpu_pretrain.cli import main

    run = tmp_path / "run"
    assert main(train_command(data_dir, run, steps=8)[3:]) == 0
    status = run_status(run)
    assert "step 8 of 8" in status and "ckpt-000000008" in status and "time trained" in status
    # More steps is a safe change: `train` on the run folder alone continues from step 8.
    assert main(["train", "--output_dir", str(run), "--num_train_steps", "12"]) == 0
    assert "step 12 of 12" in run_status(run)
    assert len(example_ids_by_step(run)) == 12
    with pytest.raises(UserInputError, match=r"train_batch_size: 8 in the run, 16 now"):
        from tpu_pretrain.train.loop import train

        config = Config.load(run / "config.json", train_batch_size=16, num_train_steps=16)
        train(config)
    assert main(["status", str(run)]) == 0


def test_a_stop_request_saves_and_the_next_start_continues(data_dir, tmp_path):
    run = tmp_path / "run"
    process = subprocess.Popen(train_command(data_dir, run, steps=400), env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    ids_log = run / "logs" / "example_ids.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (ids_log.exists() and ids_log.stat().st_size > 0):
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 75, output[-3000:]  # stopped early: not finished
    assert "Stopped early (SIGTERM received)" in output
    steps = [int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("ckpt-*")]
    assert steps and max(steps) < 400
    assert f"step {max(steps)} of 400" in run_status(run)
