"""What a newcomer reads on the command line means what it says: a live bar in a terminal (none in a pipe), the
recipe said at the start, one held-out figure over every eval sequence whether training or ``evaluate`` computes it
(and how many), no figure that means nothing (``mlm_loss`` beside an equal ``loss``, a random-next share of MLM-only
data, ``0.0 examples/s``, a ``(0.000)`` probability, an NSP accuracy that is only the majority class share)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from fault_injection import ENV, sample_data
from terminal import in_a_terminal

from tpu_pretrain.core.metrics import eval_random_next_share, format_metrics
from tpu_pretrain.data.data_folder import read_manifest

STEPS = 12
NO_DROPOUT = ("--hidden_dropout_prob", "0")  # dropout's random masks make the training call compile 2-3 times as slowly


def train_args(data_dir, run, *extra) -> list[str]:
    return [sys.executable, "-m", "tpu_pretrain", "train", "--backend", "jax", "--data_dir", str(data_dir),
            "--output_dir", str(run), "--model_size", "L2-H128", "--train_batch_size", "8", "--num_train_steps",
            str(STEPS), "--num_warmup_steps", "2", "--learning_rate", "1e-3", "--eval_every_steps", "0",
            "--save_checkpoints_steps", str(STEPS), "--session_hours", "-1", *extra]


@pytest.fixture(scope="module")
def nsp_data(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("nsp"), max_chars=40_000, num_shards=1)  # classic: NSP pairs


def held_out(data_dir) -> int:
    return read_manifest(data_dir).totals("eval")["instances"]


def test_a_terminal_gets_a_live_bar_and_training_and_evaluate_report_one_figure(nsp_data, tmp_path):
    run, sequences = tmp_path / "run", held_out(nsp_data)
    batch = next(b for b in (8, 7, 6, 5) if sequences % b)  # a last, shorter eval batch
    assert sequences > batch
    assert sequences < 100 * batch  # max_eval_steps' default reads them all
    out = in_a_terminal(["env", f"XLA_FLAGS={ENV['XLA_FLAGS']}", *train_args(
        nsp_data, run, "--recipe", "classic", "--steps_per_execution", "1", "--eval_batch_size", str(batch),
        "--log_every_steps", "6", *NO_DROPOUT)], columns=220)
    assert "Recipe: classic (as configured: Google's BERT recipe" in out
    bars = re.findall(r"training: +(\d+)%\|[^|]*\| (\d+)/12 steps", out)  # the notebooks' bar, redrawn in place
    assert bars and bars[-1] == ("100", "12") and "\r" in out, out[-2000:]
    # under the bar: the run's own progress line, as the notebooks show it, and the logged lines above it
    assert re.search(r"step 12/12: loss [\d.]+, mlm_loss [\d.]+, mlm_accuracy [\d.]+, nsp_loss", out)
    final = json.loads((run / "train_summary.json").read_text())["final_eval"]
    assert final["sequences"] == sequences  # every eval sequence, the shorter last batch included
    assert f"Final eval at step 12 ({sequences} sequences): loss" in out
    assert f"eval ({sequences} sequences) MLM accuracy" in out  # the summary

    done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "evaluate", str(run), "--sentence",
                           "The [MASK][MASK] of the file is read."], capture_output=True, text=True, env=ENV,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    evaluation = json.loads((run / "evaluation.json").read_text())
    assert evaluation["eval_examples"] == sequences and f"eval ({sequences} sequences): MLM loss" in done.stdout
    for key in ("mlm_loss", "nsp_loss", "loss"):
        assert evaluation["metrics"][key] == pytest.approx(final[key], rel=2e-6), key
    for key in ("mlm_accuracy", "nsp_accuracy"):
        assert evaluation["metrics"][key] == pytest.approx(final[key], abs=1e-7), key
    # a word of two pieces: a joint probability, small by nature, said so and never printed as 0.000
    slot = evaluation["fill_mask"][0]["masks"][0]
    assert len(slot["positions"]) == 2 and "(2 pieces, joint probability" in done.stdout
    assert "(0.000" not in done.stdout
    for candidate in slot["candidates"]:
        per_piece = f"{candidate['probability'] ** 0.5:.3f} per piece"
        assert per_piece in done.stdout


def test_a_pipe_gets_no_bar_and_mlm_only_figures_are_not_doubled(tmp_path):
    data = sample_data(tmp_path, max_chars=20_000, num_shards=1, recipe="modern")
    summary = read_manifest(data).summary()
    assert "random next" not in summary and "packed" in summary  # MLM-only data has no such pairs
    run = tmp_path / "run"
    done = subprocess.run(train_args(data, run, "--steps_per_execution", str(STEPS), "--log_every_steps", str(STEPS)),
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "\r" not in out and "%|" not in out  # not a terminal: no bar
    assert "Recipe: modern (the default for training from scratch: packed MLM-only sequences" in out
    assert re.search(r"step 12/12: loss [\d.]+, mlm_accuracy [\d.]+, lr", out), out[-2000:]
    assert "mlm_loss" not in out and "nsp" not in out.lower()  # MLM only: loss is the MLM loss
    # the run's steps ran in one compiled call, so this session measured no speed: said, not "0.0 examples/s"
    assert "0.0 examples/s" not in done.stdout and "no speed measured this session" in done.stdout
    from tpu_pretrain.export.plots import plot_scalars, read_scalars

    figure = plot_scalars(read_scalars(run))
    assert figure.axes[0].get_legend_handles_labels()[1] == ["train loss", "eval loss"]


def test_an_nsp_accuracy_at_the_majority_class_share_is_said_to_mean_nothing(nsp_data, tmp_path):
    with open(os.path.join(nsp_data, "manifest.json"), encoding="utf-8") as handle:
        evals = json.load(handle)["totals"]["eval"]
    share = eval_random_next_share(nsp_data)
    assert share == evals["random_next"] / evals["instances"] and 0 < share < 1
    majority = max(share, 1 - share)  # the accuracy of a head that always answers the commoner label
    figures = {"loss": 8.0, "mlm_loss": 7.3, "mlm_accuracy": 0.01, "nsp_loss": 0.7, "sequences": evals["instances"]}
    said = format_metrics({**figures, "nsp_accuracy": majority}, share)
    assert said.endswith(f"nsp_accuracy {majority:.4f} (= the majority class share: the head has learnt nothing "
                         "yet)")
    one_more = majority + 1 / evals["instances"] if majority < 1 else majority - 1 / evals["instances"]
    assert "majority" not in format_metrics({**figures, "nsp_accuracy": one_more}, share)
    assert "majority" not in format_metrics({**figures, "nsp_accuracy": majority}, None)  # share unknown
    assert eval_random_next_share(str(tmp_path)) is None  # no manifest: nothing claimed


def test_data_made_otherwise_than_the_runs_recipe_is_said_for_both_families(nsp_data, tmp_path, caplog):
    """A run from scratch takes the modern recipe: on classic data (NSP pairs, unpacked) it says so once, naming
    the settings and both ways out; so does a ModernBERT on unpacked MLM-only data; matching data says nothing."""
    from tpu_pretrain.config import Config
    from tpu_pretrain.core.resolve import RunPlan

    def warnings(data_dir, **settings) -> list[str]:
        caplog.clear()
        with caplog.at_level("INFO", logger="tpu_pretrain"):
            RunPlan.resolve(Config.load(data_dir=data_dir, output_dir=str(tmp_path / "run"), model_size="L2-H128",
                                        **settings))
        assert any(r.getMessage().startswith("Recipe: ") for r in caplog.records)  # the line at the start
        return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]

    said = warnings(nsp_data)
    assert len(said) == 1 and said[0].startswith(
        f"The data in {nsp_data} was made with masked_lm_prob=0.15, pack_sequences=False, where this run's modern "
        "recipe has masked_lm_prob=0.3, pack_sequences=True: the run trains on the data as it is")
    assert "`create-data --recipe modern`, or train with --recipe classic" in said[0]
    assert warnings(nsp_data, recipe="classic") == []
    unpacked = sample_data(tmp_path / "unpacked", max_chars=20_000, num_shards=1, no_nsp=True)  # classic, MLM only
    said = warnings(unpacked, model_family="modernbert")
    assert len(said) == 1 and "was made with masked_lm_prob=0.15, pack_sequences=False, where this run's modern" \
        in said[0]
