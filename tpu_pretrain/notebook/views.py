"""What a notebook shows a person: the runtime, decoded instances, a run's curves as it trains.

None of these imports TensorFlow, so a TPU notebook's kernel can show them while training runs in a
process of its own.
"""

from __future__ import annotations

import html
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..runtime import COLAB, runtime, tpu_vm_present


def describe_runtime() -> str:
    """One line: where we run, which accelerator is visible, cores, memory and free disk."""
    import psutil

    gpus = nvidia_gpus()
    accelerator = "TPU VM" if tpu_vm_present() else (f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "CPU only")
    disk = shutil.disk_usage(os.getcwd())
    return (f"Runtime: {runtime()}; accelerator: {accelerator}; {os.cpu_count()} CPU cores; "
            f"{psutil.virtual_memory().total / 2**30:.1f} GiB memory; {disk.free / 2**30:.1f} GiB free disk in "
            f"{os.getcwd()}.")


def nvidia_gpus() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    result = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                            text=True)
    return [line.strip() for line in result.stdout.splitlines() if line.strip()] if result.returncode == 0 else []


@dataclass
class Instances:
    """Decoded pretraining instances; shown as highlighted HTML in a notebook, as text elsewhere."""

    rows: list[tuple[str, list[tuple[str, str | None]]]]  # (NSP label, [(token, hidden answer or None)])

    def __str__(self) -> str:
        return "\n\n".join(f"[{label}] " + " ".join(t if a is None else f"{t}->{a}" for t, a in tokens)
                           for label, tokens in self.rows)

    def _repr_html_(self) -> str:
        parts = []
        for label, tokens in self.rows:
            words = [html.escape(t) if a is None else
                     f'<mark title="hides {html.escape(a)}">{html.escape(t)}<sub>{html.escape(a)}</sub></mark>'
                     for t, a in tokens]
            parts.append(f"<p><b>[{html.escape(label)}]</b> {' '.join(words)}</p>")
        return ('<div style="font-family:monospace;line-height:1.8">' + "".join(parts) +
                "<p><i>highlighted: a masked position; small: the token it hides, which the model must predict.</i>"
                "</p></div>")


def show_instances(data_dir: str | os.PathLike, count: int = 3, split: str = "train") -> Instances:
    """A few pretraining instances decoded to tokens, masked positions marked with the tokens they hide."""
    from ..data.data_folder import data_vocab_file, load_manifest
    from ..data.tfrecord import decode_example, read_records
    from ..data.tokenization import load_tokenizer

    data_dir = Path(data_dir)
    manifest = load_manifest(data_dir)
    tokenizer = load_tokenizer(str(data_vocab_file(data_dir)), do_lower_case=manifest.settings["do_lower_case"])
    rows = []
    for record in read_records(data_dir / manifest.files(split)[0]):
        example = decode_example(record)
        length = int(example["input_mask"].sum())
        tokens: list[tuple[str, str | None]] = [(t, None) for t in
                                                tokenizer.convert_ids_to_tokens(example["input_ids"][:length])]
        for position, answer, weight in zip(example["masked_lm_positions"], example["masked_lm_ids"],
                                            example["masked_lm_weights"], strict=True):
            if weight > 0:
                tokens[position] = (tokens[position][0], tokenizer.inv_vocab[answer])
        with_nsp = not manifest.settings.get("no_nsp", False)
        label = ("random next" if example["next_sentence_labels"][0] else "actual next") if with_nsp else "MLM only"
        rows.append((label, tokens))
        if len(rows) == count:
            break
    return Instances(rows)


class LiveCurves:
    """A run's loss and accuracy curves in one output area, redrawn as its TensorBoard logs grow."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.handle = None
        self.drawn = None

    def refresh(self) -> None:
        from ..core.run_folder import RunFolder
        from ..errors import UserInputError
        from ..export.plots import masking_rates, plot_scalars, read_scalars

        try:
            scalars = read_scalars(self.run_dir)
            figure = plot_scalars(scalars, title=self.run_dir.name, masking=masking_rates(self.run_dir))
        except UserInputError:  # no scalars yet
            return
        points = sum(len(v) for split in scalars.values() for v in split.values())
        if points == self.drawn:
            return
        from IPython.display import Image, display

        path = RunFolder(self.run_dir).curves_file.with_name("live.png")  # beside the curves evaluate draws
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=90)
        image = Image(filename=str(path))
        if self.handle is None:
            self.handle = display(image, display_id=True)
        else:
            self.handle.update(image)
        self.drawn = points


def status(run_dir: str | os.PathLike) -> str:
    """Where a run stands: step, newest checkpoint and its mirror, time trained and left."""
    from ..core.status import run_status

    return run_status(run_dir)


def show_curves(run_dir: str | os.PathLike) -> None:
    """The run's loss and accuracy curves, inline."""
    from ..errors import UserInputError
    from ..export.plots import show_run

    try:
        show_run(run_dir)
    except UserInputError as exc:
        print(f"No curves yet: {exc}")


def tensorboard(run_dir: str | os.PathLike) -> str:
    """On Colab, TensorBoard inline, following the run's logs as it trains; elsewhere, say what replaces it."""
    if runtime() != COLAB or importlib.util.find_spec("tensorboard") is None:
        return "The training cell below redraws the curves as they grow (TensorBoard inline is Colab's)."
    from IPython import get_ipython

    shell = get_ipython()
    shell.run_line_magic("load_ext", "tensorboard")
    shell.run_line_magic("tensorboard", f"--logdir {Path(run_dir) / 'logs'}")
    return f"TensorBoard follows {Path(run_dir) / 'logs'}."
