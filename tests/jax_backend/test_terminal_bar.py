"""The training bar in a real terminal (a pseudo-terminal of a given width, read through a small screen model):
the line under the bar keeps the step, loss, ETA and newest saved step however narrow the window (its lesser
figures go first, never the end of the line), the last step's line is on the screen once, and a terminal that
reports 0 columns still gets a bar and a line (80 columns assumed), not a collapsed bar and a silent run."""

from __future__ import annotations

import re
import sys

import pytest
from fault_injection import sample_data
from terminal import in_a_terminal

pytest.importorskip("jax")

STEPS = 24
FRAME = re.compile(r"\r(step \d+/\d+:[^\r\n\x1b]*?) *\x1b\[A")  # the line under the bar, redrawn in place


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("bar"), max_chars=20_000, num_shards=1, recipe="modern")


def screen(out: str, columns: int) -> list[str]:
    """The rows a terminal ``columns`` wide shows at the end: carriage return, line feed, cursor up (what tqdm
    writes), other escape sequences ignored, a line longer than the width wrapped."""
    rows: list[list[str]] = [[]]
    row = column = 0
    position = 0
    while position < len(out):
        escape = re.match(r"\x1b\[(\d*)([A-Za-z])", out[position:])
        if escape:
            if escape[2] == "A":
                row = max(0, row - int(escape[1] or 1))
            position += len(escape[0])
            continue
        char, position = out[position], position + 1
        if char == "\r":
            column = 0
            continue
        if char == "\n" or column >= columns:
            row, column = row + 1, 0
        while len(rows) <= row:
            rows.append([])
        if char == "\n":
            continue
        line = rows[row]
        line.extend(" " * (column + 1 - len(line)))
        line[column] = char
        column += 1
    return ["".join(line).rstrip() for line in rows]


def train(data_dir, run) -> list[str]:
    return [sys.executable, "-m", "tpu_pretrain", "train", "--backend", "jax", "--data_dir", str(data_dir),
            "--output_dir", str(run), "--model_size", "L2-H128", "--train_batch_size", "8", "--num_train_steps",
            str(STEPS), "--num_warmup_steps", "2", "--learning_rate", "1e-3", "--eval_every_steps", "0",
            "--save_checkpoints_steps", "8", "--log_every_steps", "12", "--steps_per_execution", "1",
            "--session_hours", "-1"]


def test_a_narrow_terminal_keeps_the_saved_step_and_shows_the_last_line_once(data_dir, tmp_path):
    columns = 60
    out = in_a_terminal(train(data_dir, tmp_path / "run"), columns)
    frames = FRAME.findall(out)
    assert frames, out[-3000:]
    for frame in frames:  # within the window, and the facts that matter kept, whatever went
        assert len(frame) < columns and re.search(r", ETA \d+:\d\d:\d\d; saved (step \d+|none yet)$", frame), frame
        assert re.match(r"step \d+/24: loss [\d.]+", frame), frame
    assert any(frame.endswith("; saved step 16") for frame in frames), frames
    rows = screen(out, columns)
    last = [row for row in rows if row.startswith(f"step {STEPS}/{STEPS}:")]
    assert len(last) == 1, "\n".join(rows)  # the log's line, whole (wrapped); the one under the bar is gone
    assert any(re.fullmatch(r"training: 100%\|█+\| 24/24 steps", row) for row in rows), "\n".join(rows)


def test_a_terminal_of_0_columns_gets_a_bar_and_its_line(data_dir, tmp_path):
    out = in_a_terminal(train(data_dir, tmp_path / "run"), 0)
    bars = re.findall(r"training: +\d+%\|([^|]*)\| (\d+)/24 steps", out)
    assert bars and bars[-1][1] == "24", out[-3000:]
    assert all(len(bar) >= 40 for bar, _ in bars), bars  # an 80-column bar, not a collapsed one
    frames = FRAME.findall(out)
    assert frames and all(len(frame) < 80 and "; saved " in frame for frame in frames), frames
