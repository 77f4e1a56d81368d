"""A run resolved once: its settings decided by one resolver and frozen (a resumed run's schedule is a new plan),
and a run continued from its own record the same way whether the command line or ``train()`` continues it."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from fault_injection import ENV, sample_data

from tpu_pretrain.config import Config
from tpu_pretrain.core.checkpoints import list_checkpoints
from tpu_pretrain.core.resolve import RunPlan
from tpu_pretrain.core.run_folder import RunFolder

SETTINGS = ["--backend", "jax", "--model_size", "L2-H128", "--train_batch_size", "8", "--learning_rate", "3e-3",
            "--num_warmup_steps", "-1", "--train_seed", "7", "--eval_every_steps", "0", "--save_checkpoints_steps",
            "3", "--session_hours", "-1"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("continued"), max_chars=30_000, num_shards=1, recipe="modern")


def cli_train(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "train", *args], env=ENV, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def newest_weights(run) -> dict[str, np.ndarray]:
    newest = list_checkpoints(RunFolder(run).checkpoints)[0]
    with np.load(f"{newest.path}/state.npz") as arrays:
        return {name: arrays[name] for name in arrays.files}


def test_the_command_line_and_train_continue_a_run_identically(data_dir, tmp_path):
    """A run started with settings of its own, continued by naming only its folder and a longer run: the command
    line and ``train()`` read the run's record alike, so both continue it to the same settings and weights."""
    started = tmp_path / "started"
    cli_train("--data_dir", data_dir, "--output_dir", str(started), "--num_train_steps", "3", *SETTINGS)
    by_cli, by_python = tmp_path / "by_cli", tmp_path / "by_python"
    shutil.copytree(started, by_cli)
    shutil.copytree(started, by_python)

    cli_train("--output_dir", str(by_cli), "--num_train_steps", "6", "--rewarm_steps", "2")
    script = (f"from tpu_pretrain.training import train; train(output_dir={str(by_python)!r}, num_train_steps=6, "
              "rewarm_steps=2, progress=False)")
    done = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    recorded = [json.loads(RunFolder(run).config_file.read_text()) for run in (by_cli, by_python)]
    for settings in recorded:
        settings["storage"].pop("output_dir")
    assert recorded[0] == recorded[1]
    assert recorded[0]["train"]["learning_rate"] == 3e-3 and recorded[0]["train"]["train_seed"] == 7
    cli_weights, python_weights = newest_weights(by_cli), newest_weights(by_python)
    assert int(cli_weights["step"]) == int(python_weights["step"]) == 6
    for name, value in cli_weights.items():
        np.testing.assert_array_equal(value, python_weights[name], err_msg=name)


def test_a_resolved_plan_refuses_edits_and_a_resumed_run_is_a_new_plan(data_dir, tmp_path):
    """The resolver decides the automatic settings once (warmup and eval cadence -1, document masks auto, the
    backend) and freezes them; re-planning the schedule from a checkpoint's record returns another plan and leaves
    this one as it was."""
    plan = RunPlan.resolve(Config.load(data_dir=data_dir, output_dir=str(tmp_path / "run"), model_size="L2-H128",
                                       train_batch_size=8, num_train_steps=100), backend="jax")
    t = plan.config.train
    assert (t.backend, t.document_masks, t.num_warmup_steps, t.eval_every_steps) == ("jax", "on", 10, 50)
    with pytest.raises(dataclasses.FrozenInstanceError, match="resolved and frozen"):
        plan.config.train.num_warmup_steps = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.schedule = plan.planned_schedule
    recorded = dataclasses.replace(plan.schedule, warmup_end=4).record(dataclasses.replace(plan.schedule,
                                                                                           warmup_end=4))
    resumed, _ = plan.resumed(recorded, step=5)
    assert resumed.config.train.num_warmup_steps == 4 and t.num_warmup_steps == 10
    assert resumed.config.frozen and resumed is not plan
    batch = plan.with_batch(16, 2)
    assert (batch.config.train.train_batch_size, batch.config.train.gradient_accumulation_steps) == (16, 2)
    assert plan.config.train.train_batch_size == 8
