"""Exact resume: training processes killed with SIGKILL (inside steps and inside checkpoint writes) and
restarted end with the same weights, having seen the same examples, as a run that was never interrupted."""

import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_injection import ENV, STEPS, check_resumed_run, example_ids_by_step, sample_data, train_command

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)

import tensorflow as tf  # isort: skip

from tpu_pretrain.config import Config
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.train.status import run_status


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
    assert process.returncode == 0, output[-3000:]
    assert "Stopped early (SIGTERM received)" in output
    steps = [int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("ckpt-*")]
    assert steps and max(steps) < 400
    assert f"step {max(steps)} of 400" in run_status(run)
