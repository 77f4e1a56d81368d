"""Exact resume: training processes killed with SIGKILL (inside steps and inside checkpoint writes) and
restarted end with the same weights, having seen the same examples, as a run that was never interrupted,
with dropout on (its masks are a function of seed and step, like the data order)."""

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from fault_injection import ENV, STEPS, check_resumed_run, example_ids_by_step, sample_data, train_command

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)

import tensorflow as tf  # isort: skip

from tpu_pretrain.config import Config
from tpu_pretrain.core.status import run_status
from tpu_pretrain.errors import UserInputError


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("resume_data"))


def final_variables(run_dir, step=STEPS):
    reader = tf.train.load_checkpoint(str(Path(run_dir) / "checkpoints" / f"ckpt-{step:09d}" / "state"))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("model/") and "OPTIMIZER_SLOT" not in n]
    return {n: reader.get_tensor(n) for n in names}


@pytest.mark.slow
def test_sigkilled_training_resumes_to_the_same_weights_and_examples(data_dir, tmp_path):
    check_resumed_run(data_dir, tmp_path, final_variables)


def test_a_resumed_run_draws_the_same_dropout_masks(data_dir, tmp_path):
    """Dropout on; a constant learning rate, so that stopping at 6 of 12 steps changes nothing but the stop."""
    from tpu_pretrain.training import train

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
    # the run has finished (its rate decayed to 0): extending it needs a new warmup, and says so
    assert main(["train", "--output_dir", str(run), "--num_train_steps", "12"]) == 2
    assert main(["train", "--output_dir", str(run), "--num_train_steps", "12", "--rewarm_steps", "2"]) == 0
    assert "step 12 of 12" in run_status(run)
    assert len(example_ids_by_step(run)) == 12
    with pytest.raises(UserInputError, match=r"train_batch_size: 8 in the run, 16 now"):
        from tpu_pretrain.training import train

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
