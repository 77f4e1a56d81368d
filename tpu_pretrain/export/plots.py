"""Loss and accuracy curves of a run, read from its TensorBoard logs and drawn with matplotlib.

For a PNG next to the run (``plot_run(RUN)`` writes ``RUN/plots/curves.png``) and for a notebook
cell (``show_run(RUN)`` displays it inline), without TensorBoard or TensorFlow: the event files are
TFRecords of ``Event`` protos, read here directly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..core.run_folder import RunFolder
from ..data.tfrecord import read_records
from ..errors import UserInputError
from ..wire_format import proto_fields

# Panels: title and the scalar tags drawn in it (each for train and eval where present).
PANELS = (("Loss", ("loss", "mlm_loss", "nsp_loss")),
          ("MLM accuracy", ("mlm_accuracy",)),
          ("NSP accuracy", ("nsp_accuracy",)))


def read_scalars(run_dir: str | os.PathLike) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{"train": {tag: [(step, value), ...]}, "eval": {...}}`` from ``RUN/logs/<split>/events.*``.

    Later events for the same step win, so a resumed run's repeated steps are not drawn twice. The event
    files are read without TensorFlow, so a notebook can draw a run's curves while it trains elsewhere.
    """
    logs = RunFolder(run_dir).logs
    if not logs.is_dir():
        raise UserInputError(f"{run_dir} has no logs/ folder: no TensorBoard scalars to plot yet.")
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for split_dir in sorted(p for p in logs.iterdir() if p.is_dir()):
        tags: dict[str, dict[int, float]] = {}
        for path in sorted(split_dir.glob("events.out.tfevents.*"), key=os.path.getmtime):
            try:
                for step, tag, value in event_scalars(path):
                    tags.setdefault(tag, {})[step] = value
            except ValueError:  # the last record of a file being written: the next read completes it
                continue
        out[split_dir.name] = {tag: sorted(points.items()) for tag, points in tags.items()}
    return out


def event_scalars(path: str | os.PathLike):
    """(step, tag, value) of each scalar in a TensorBoard event file (a TFRecord file of ``Event`` protos)."""
    for record in read_records(path):
        event = {number: value for number, _, value in proto_fields(record)}
        step = event.get(EVENT_STEP, 0)
        for number, _, value in proto_fields(event.get(EVENT_SUMMARY, b"")):
            if number == SUMMARY_VALUE:
                scalar = _scalar(value)
                if scalar is not None:
                    yield step, scalar[0], scalar[1]


# Field numbers of TensorFlow's Event, Summary, Summary.Value and TensorProto messages.
EVENT_STEP, EVENT_SUMMARY, SUMMARY_VALUE = 2, 5, 1
VALUE_TAG, VALUE_SIMPLE, VALUE_TENSOR = 1, 2, 8
TENSOR_DTYPE, TENSOR_CONTENT, TENSOR_FLOATS, TENSOR_DOUBLES = 1, 4, 5, 6
DT_DOUBLE = 2


def _scalar(value: bytes) -> tuple[str, float] | None:
    fields = {number: item for number, _, item in proto_fields(value)}
    tag = fields.get(VALUE_TAG, b"").decode()
    if VALUE_SIMPLE in fields:
        return tag, float(np.frombuffer(fields[VALUE_SIMPLE], "<f4")[0])
    if VALUE_TENSOR not in fields:
        return None
    tensor = {number: item for number, _, item in proto_fields(fields[VALUE_TENSOR])}
    dtype = "<f8" if tensor.get(TENSOR_DTYPE) == DT_DOUBLE else "<f4"
    raw = tensor.get(TENSOR_CONTENT) or tensor.get(TENSOR_FLOATS) or tensor.get(TENSOR_DOUBLES)
    return (tag, float(np.frombuffer(raw, dtype)[0])) if raw else None


def masking_rates(run_dir: str | os.PathLike) -> dict[str, float]:
    """The share of tokens masked in the training and the held-out sequences, from the run's config.json (the data's
    rates, or dynamic masking's own for training); empty where the run records none."""
    try:
        data = json.loads(RunFolder(run_dir).config_file.read_text()).get("data", {})
    except (OSError, ValueError):
        return {}
    rates = {"train": data.get("masked_lm_prob"), "eval": data.get("eval_masked_lm_prob")}
    return {split: rate for split, rate in rates.items() if isinstance(rate, int | float)}


def _label(split: str, tag: str, masking: dict[str, float]) -> str:
    """``train loss (30% masked)``: an MLM figure depends on the share of tokens masked, which training and the
    held-out sequences may not share (the modern recipe trains at 30%, evaluates at BERT's 15%)."""
    rate = masking.get(split) if tag != "nsp_loss" and len(set(masking.values())) > 1 else None
    return f"{split} {tag}" + (f" ({rate:.0%} masked)" if rate is not None else "")


def plot_scalars(scalars: dict, title: str = "", masking: dict[str, float] | None = None):
    """A matplotlib Figure with one panel per quantity present (loss, MLM accuracy, NSP accuracy). With
    ``masking`` (:func:`masking_rates`) at two rates, each MLM curve is labelled with its split's rate and the panels
    say that train and eval figures are not comparable."""
    from matplotlib.figure import Figure

    panels = [(name, tags) for name, tags in PANELS
              if any(tag in split for split in scalars.values() for tag in tags)]
    if not panels:
        raise UserInputError("No loss or accuracy scalars in the logs yet.")
    fig = Figure(figsize=(5.0 * len(panels), 4.0), layout="constrained")
    styles = {"train": dict(linestyle="-", alpha=0.8), "eval": dict(linestyle="--", marker="o", markersize=4)}
    mlm_only = not any("nsp_loss" in split for split in scalars.values())
    for i, (name, tags) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for n, tag in enumerate(tags):  # one colour per quantity: train solid, eval dashed
            for split in ("train", "eval"):
                points = scalars.get(split, {}).get(tag)
                if not points or (mlm_only and tag == "mlm_loss"):  # MLM only: the same curve as loss
                    continue
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, label=_label(split, tag, masking or {}), color=f"C{n}", **styles[split])
        differ = masking and len(set(masking.values())) > 1 and name != "NSP accuracy"
        if differ:
            ax.set_title(f"{name}\n(train and eval masked at different rates: not comparable)", fontsize="medium")
        else:
            ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        if "accuracy" in name.lower():
            ax.set_ylim(bottom=0)
    if title:
        fig.suptitle(title)
    return fig


def run_figure(run_dir: str | os.PathLike):
    """The matplotlib Figure of a run's curves (train solid, eval dashed)."""
    return plot_scalars(read_scalars(run_dir), title=Path(run_dir).resolve().name, masking=masking_rates(run_dir))


def plot_run(run_dir: str | os.PathLike, output: str | os.PathLike | None = None, dpi: int = 110) -> Path:
    """Draw a run's curves to a PNG (default ``RUN/plots/curves.png``) and return its path."""
    output = Path(output) if output else RunFolder(run_dir).curves_file
    output.parent.mkdir(parents=True, exist_ok=True)
    run_figure(run_dir).savefig(output, dpi=dpi)
    return output


def show_run(run_dir: str | os.PathLike, output: str | os.PathLike | None = None) -> Path:
    """In a notebook: draw the curves inline (the PNG is saved as :func:`plot_run` does)."""
    from IPython.display import Image, display

    path = plot_run(run_dir, output)
    display(Image(filename=str(path)))
    return path
