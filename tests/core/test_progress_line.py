"""The training log line a person reads: step/total, loss, learning rate, sequences/s, MFU where the peak is known,
the ETA at the run's own rate (right after a resume too) and the newest saved step; and the published peaks the
MFU is measured against."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_injection import ENV, sample_data, train_command

from tpu_pretrain.config import Config
from tpu_pretrain.core.peaks import group_peak, mfu, published_peak
from tpu_pretrain.core.schedules import planned
from tpu_pretrain.models.bert_config import BertConfig, bert_config_for_size, training_flops_per_sequence

STEPS = 48
LINE = re.compile(r"^step (?P<step>\d+)/(?P<total>\d+): loss (?P<loss>[\d.]+), .*, lr (?P<lr>[\d.e+-]+), "
                  r"(?P<rate>[\d.]+) steps/s, (?P<sequences>[\d.]+) sequences/s(?:, MFU (?P<mfu>[\d.]+)%)?"
                  r"(?:, input wait \d+%)?, ETA (?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d); (?P<saved>.+)$")


def test_published_peaks_by_the_names_the_frameworks_give():
    assert published_peak("TPU v5 lite", "bfloat16") == 197e12  # JAX's device_kind on Colab's and Kaggle's v5e
    assert published_peak("v5litepod-8", "bfloat16") == 197e12  # a TPU VM's accelerator type (TensorFlow)
    assert published_peak("TPU v3", "bfloat16") == published_peak("v3-8", "bfloat16") == 61.5e12  # per core
    assert published_peak("TPU v5", "bfloat16") == published_peak("v5p-8", "bfloat16") == 459e12
    assert published_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert published_peak("NVIDIA H100 80GB HBM3", "float32") == 494e12  # TF32, as XLA computes float32
    assert published_peak("Tesla T4", "float16") == 65e12 and published_peak("Tesla T4", "float32") == 8.1e12
    assert published_peak("NVIDIA L4", "bfloat16") == 121e12
    for unknown in ("NVIDIA L40S", "cpu", "", "TPU"):
        assert published_peak(unknown, "bfloat16") is None
    assert group_peak("TPU v5 lite", "bfloat16", 8) == 8 * 197e12 and group_peak("cpu", "float32", 4) is None


def test_mfu_of_bert_base_on_a_v5e_8_by_hand():
    config = bert_config_for_size("L12-H768", 30522)
    flops = training_flops_per_sequence(config, 128, 20)
    # forward: 11 layers x (128 x (8 x 768^2 + 4 x 768 x 3072) + 4 x 128^2 x 768) = 20,484,980,736
    #        + the last: keys and values at 128 positions, 128 x 4 x 768^2       =    301,989,888
    #          the rest at the 21 rows the losses read (20 masked, the first):
    #          21 x (4 x 768^2 + 4 x 768 x 3072) + 4 x 21 x 128 x 768             =    255,983,616
    #        + MLM head at 20 positions: 20 x (2 x 768^2 + 2 x 768 x 30522)      =    961,228,800
    #        + pooler and NSP: 2 x 768^2 + 4 x 768                                 =      1,182,720
    # training = 3 x forward                                                      = 66,016,097,280
    assert flops == 66_016_097_280
    # the TensorFlow backend computes the last block at every position: 12 whole blocks, 69,928,989,696
    assert training_flops_per_sequence(config, 128, 20, "tensorflow") == 3 * (22_347_251_712 + 961_228_800 + 1_182_720)
    peak = group_peak("TPU v5 lite", "bfloat16", 8)  # Kaggle's v5e-8: 8 chips of 197 TFLOP/s
    assert mfu(4000.0, flops, peak) == pytest.approx(4000 * 66_016_097_280 / 1.576e15)  # 16.8%
    assert mfu(4000.0, flops, None) is None


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("progress_data"), num_shards=2)


def stop_after_a_save(command: list[str], run: Path) -> None:
    """Start training, ask it to stop (SIGTERM) once it has saved a checkpoint; it saves again and stops."""
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and not list((run / "checkpoints").glob("ckpt-*")):
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=300) == 75  # stopped early, to be continued


def newest_checkpoint(run: Path) -> tuple[int, float]:
    """The step of the run's newest checkpoint, and the rate (steps/s) it recorded."""
    newest = max((run / "checkpoints").glob("ckpt-*"))
    return int(newest.name.split("-")[1]), json.loads((newest / "checkpoint.json").read_text())["metadata"][
        "steps_per_second"]


def check_resumed_lines(lines: list[str], run: Path, resumed_at: int, saved_rate: float, peak_flops: float) -> None:
    """The progress lines of a run resumed at ``resumed_at``: each figure there, and right."""
    found = [LINE.match(line) for line in lines if line.startswith("step ")]
    assert found and all(found), lines
    first = found[0]
    total = int(first["total"])
    schedule = planned(Config.load(run / "config.json").train)  # the settings did not change: the run's schedule
    bert = BertConfig.from_json_file(run / "bert_config.json")
    flops = training_flops_per_sequence(bert, 64, 10)
    for match in found:
        step, rate = int(match["step"]), float(match["rate"])
        assert int(match["total"]) == total and step > resumed_at
        assert float(match["lr"]) == pytest.approx(schedule.rate(step - 1), rel=5e-3)
        assert float(match["sequences"]) == pytest.approx(8 * rate, rel=0.01, abs=0.1)
        eta = int(match["h"]) * 3600 + int(match["m"]) * 60 + int(match["s"])
        assert abs(eta - (total - step) / rate) <= 1 + (total - step) / rate * 0.01  # at the rate it states
        assert float(match["mfu"]) == pytest.approx(100 * 8 * rate * flops / peak_flops, rel=0.02, abs=0.06)
        assert re.fullmatch(r"saved step \d+", match["saved"]) and int(match["saved"].split()[-1]) < step
    # Right after the resume the rate is the run's own, as its checkpoint saved it, not the first call's, which
    # compiled: the same rate, and the ETA from it.
    assert float(first["rate"]) == pytest.approx(saved_rate, abs=0.006)
    assert first["saved"] == f"saved step {resumed_at}"


def test_the_line_of_a_resumed_run_streamed_into_a_cell(data_dir, tmp_path, capsys):
    """The line is the run core's, the same for both backends: one backend's run shows it (JAX: no TensorFlow
    start-up, the quicker of the two)."""
    backend = "jax"
    pytest.importorskip(backend)
    from tpu_pretrain.notebook.steps import stream

    run = tmp_path / "run"
    # A CPU's peak is not published: state one, so the line has an MFU. Calls of 4 steps: the first line after
    # the resume follows the session's first call alone (which compiles), so its rate is the run's own, as saved.
    extra = ["--backend", backend, "--peak_tflops", "1", "--steps_per_execution", "4"]
    command = train_command(data_dir, run, steps=STEPS, extra=extra)
    stop_after_a_save(command, run)
    resumed_at, saved_rate = newest_checkpoint(run)
    assert stream(command, None, 30.0, ENV) == 0
    shown = capsys.readouterr()
    lines = shown.out.splitlines()
    assert any(line.startswith("Resuming from ") and f"step {resumed_at} of" in line for line in lines)
    print("\n".join(line for line in lines if line.startswith("step ")))
    check_resumed_lines(lines, run, resumed_at, saved_rate, 1e12)
    # The bar (tqdm, on stderr here) starts at the first step reported and has no rate or ETA of its own.
    bar = [frame.strip() for frame in re.split(r"[\r\n]", shown.err) if frame.strip().startswith("training:")]
    first = int(LINE.match(next(line for line in lines if line.startswith("step ")))["step"])
    assert bar and all(re.fullmatch(r"training: +\d+%\|.*\| \d+/\d+ steps", frame) for frame in bar), bar
    assert f"{first}/{STEPS} steps" in bar[0] and not any(" 0/" in frame for frame in bar)
    # status reports the run's measured speed and MFU, from its newest checkpoint
    from tpu_pretrain.core.status import run_status

    speed = next(line for line in run_status(run).splitlines() if line.startswith("speed: "))
    assert re.fullmatch(r"speed: [\d.]+ steps/s, [\d,.]+ sequences/s, [\d,]+ tokens/s, MFU [\d.]+%", speed), speed
