"""curves.png read right: training's loss (the modern recipe masks 30% of tokens) and the held-out loss (BERT's 15%)
are figures of two tasks, so the curves drawn from a real run's logs name each one's masking rate and the panel says
they do not compare; a run whose two rates are the same keeps the plain labels."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fault_injection import ENV, sample_data

pytest.importorskip("matplotlib")

STEPS = 8


def trained(data_dir, run) -> None:
    """A few steps of a tiny model through ``tpu-pretrain train``, with held-out evals on the way (JAX backend where
    it is installed: the quicker start)."""
    backend = "jax" if _installed("jax") else "tensorflow"
    done = subprocess.run(
        [sys.executable, "-m", "tpu_pretrain", "train", "--backend", backend, "--data_dir", str(data_dir),
         "--output_dir", str(run), "--model_size", "L2-H128", "--train_batch_size", "8", "--num_train_steps",
         str(STEPS), "--num_warmup_steps", "2", "--learning_rate", "1e-3", "--eval_every_steps", "4",
         "--max_eval_steps", "1", "--save_checkpoints_steps", str(STEPS), "--log_every_steps", "2",
         "--session_hours", "-1"], capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_train_and_eval_losses_at_different_masking_rates_are_labelled(tmp_path):
    from tpu_pretrain.export.plots import plot_run, run_figure

    data = sample_data(tmp_path, max_chars=20_000, num_shards=1, recipe="modern")  # trains at 30%, evaluates at 15%
    run = tmp_path / "run"
    trained(data, run)
    figure = run_figure(run)
    loss, accuracy = figure.axes[:2]
    assert loss.get_legend_handles_labels()[1] == ["train loss (30% masked)", "eval loss (15% masked)"]
    assert accuracy.get_legend_handles_labels()[1] == ["train mlm_accuracy (30% masked)",
                                                       "eval mlm_accuracy (15% masked)"]
    for ax in (loss, accuracy):
        assert "train and eval masked at different rates: not comparable" in ax.get_title()
    assert plot_run(run).is_file()  # the PNG evaluate and the demo write


def test_one_masking_rate_keeps_the_plain_labels(tmp_path):
    from tpu_pretrain.export.plots import run_figure

    data = sample_data(tmp_path, max_chars=20_000, num_shards=1, recipe="classic")  # 15% for both
    run = tmp_path / "run"
    trained(data, run)
    figure = run_figure(run)
    assert figure.axes[0].get_legend_handles_labels()[1][:2] == ["train loss", "eval loss"]
    assert figure.axes[0].get_title() == "Loss"
