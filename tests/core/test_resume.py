"""Exact resume: training processes killed with SIGKILL (inside steps and inside checkpoint writes) and
restarted end with the same weights, having seen the same examples, as a run that was never interrupted,
with dropout on (its masks are a function of seed and step, like the data order)."""

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from fault_injection import ENV, example_ids_by_step, sample_data, train_command

import tpu_pretrain  # noqa: F401  (Keras 2 before TensorFlow)

import tensorflow as tf  # isort: skip

from tpu_pretrain.config import Config
from tpu_pretrain.core.status import run_status
from tpu_pretrain.errors import UserInputError

STEPS = 24  # of the runs that the SIGKILL and status tests train with fault_injection's settings


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("resume_data"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A one-layer BERT (hidden 64; the sample data's 1,500 tokens) for every run here: what is checked is the
    resume, not the model, and its build, compile and checkpoints are the cheapest."""
    path = tmp_path_factory.mktemp("model") / "bert_config.json"
    path.write_text(json.dumps({"vocab_size": 1500, "hidden_size": 64, "num_hidden_layers": 1,
                                "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64}))
    return str(path)


@pytest.fixture(scope="module")
def finished_run(data_dir, tiny_model, tmp_path_factory) -> Path:
    """A run of STEPS never interrupted, by the CLI in a process of its own (its rate decayed to 0 at the end): the
    reference of the SIGKILL test and the finished run that the status test continues (in a copy)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    done = subprocess.run(train_command(data_dir, run, STEPS, ("--bert_config_file", tiny_model)), env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def final_variables(run_dir, step):
    reader = tf.train.load_checkpoint(str(Path(run_dir) / "checkpoints" / f"ckpt-{step:09d}" / "state"))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("model/") and "OPTIMIZER_SLOT" not in n]
    return {n: reader.get_tensor(n) for n in names}


def sigkill_when(command: list[str], ready) -> int:
    """Start ``command`` and SIGKILL it as soon as ``ready(pid)`` holds; its pid."""
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not ready(process.pid):
        assert process.poll() is None and time.time() < deadline, "it ended before it could be killed"
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return process.pid


@pytest.mark.slow
def test_sigkilled_training_resumes_to_the_same_weights_and_examples(data_dir, tiny_model, finished_run, tmp_path):
    """SIGKILLed among steps (5-8, after the checkpoint of step 4), then, resumed from it, inside the write of the
    next checkpoint (its temporary folder), then finished: the same weights as a run never interrupted and the
    same examples at every step, each replayed step's included (dropout on: its masks are a function of seed
    and step, like the data order)."""
    run = tmp_path / "interrupted"
    checkpoints, ids = run / "checkpoints", run / "logs" / "example_ids.jsonl"
    command = train_command(data_dir, run, STEPS, ("--bert_config_file", tiny_model))
    sigkill_when(command, lambda pid: ids.exists() and max(example_ids_by_step(run), default=0) >= 5)
    assert sorted(p.name for p in checkpoints.glob("*ckpt-*")) == ["ckpt-000000004"]  # killed among steps
    sigkill_when(command, lambda pid: any(checkpoints.glob(f".ckpt-*.tmp-{pid}")))
    final = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]

    expected, got = final_variables(finished_run, STEPS), final_variables(run, STEPS)
    assert expected.keys() == got.keys() and len(expected) > 10
    for name in expected:
        assert float(abs(got[name] - expected[name]).max()) <= 1e-6, name
    reference_ids, resumed_ids = example_ids_by_step(finished_run), example_ids_by_step(run)  # replays: same ids
    assert sorted(resumed_ids) == list(range(1, STEPS + 1))
    assert resumed_ids == reference_ids  # the same examples at every step: none repeated, none skipped
    logged = [line for line in ids.read_text().splitlines() if line.endswith("}")]
    assert len(logged) >= STEPS + 5  # steps 5 and on ran again after each kill


def test_a_resumed_run_draws_the_same_dropout_masks(data_dir, tiny_model, tmp_path):
    """Dropout on: a run trained to step 12, put back to its checkpoint of step 6 (that of step 12 removed) and
    trained again to 12 by a new trainer, ends with the same weights."""
    from tpu_pretrain.training import train

    run = tmp_path / "run"
    config = Config.load(output_dir=str(run), data_dir=data_dir, bert_config_file=tiny_model, train_batch_size=8,
                         num_train_steps=12, num_warmup_steps=0, learning_rate=1e-3, save_checkpoints_steps=6,
                         eval_every_steps=0, max_eval_steps=1, hidden_dropout_prob=0.1, train_seed=3,
                         shuffle_buffer_size=64)
    train(config, progress=False)
    expected = final_variables(run, 12)
    shutil.rmtree(run / "checkpoints" / "ckpt-000000012")
    resumed = train(config, progress=False)
    assert resumed.history[0]["step"] > 6 and resumed.history[-1]["step"] == 12, resumed.history  # from step 6
    got = final_variables(run, 12)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-6, rtol=0, err_msg=name)


def test_status_and_continuing_with_safe_and_unsafe_changes(finished_run, tmp_path):
    """On a copy of a finished run (its rate decayed to 0): its status, and continuing it with more steps (with a
    new warmup), and not with another batch size."""
    from tpu_pretrain.cli import main

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    status = run_status(run)
    assert f"step {STEPS} of {STEPS}" in status and f"ckpt-{STEPS:09d}" in status and "time trained" in status
    more = str(STEPS + 4)
    # More steps is a safe change: `train` on the run folder alone continues from the last step.
    # the run has finished (its rate decayed to 0): extending it needs a new warmup, and says so
    assert main(["train", "--output_dir", str(run), "--num_train_steps", more]) == 2
    assert main(["train", "--output_dir", str(run), "--num_train_steps", more, "--rewarm_steps", "2"]) == 0
    assert f"step {more} of {more}" in run_status(run)
    assert len(example_ids_by_step(run)) == STEPS + 4
    with pytest.raises(UserInputError, match=r"train_batch_size: 8 in the run, 16 now"):
        from tpu_pretrain.training import train

        config = Config.load(run / "config.json", train_batch_size=16, num_train_steps=STEPS + 8)
        train(config)
    assert main(["status", str(run)]) == 0


def test_a_stop_request_saves_and_the_next_start_continues(data_dir, tiny_model, tmp_path):
    run = tmp_path / "run"
    process = subprocess.Popen(train_command(data_dir, run, 400, ("--bert_config_file", tiny_model)), env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
