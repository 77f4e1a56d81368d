"""Helpers the notebooks call, so that no logic lives in a notebook cell.

A description of the runtime, a parameter panel that gives Kaggle and Jupyter users the same choices
as Colab's ``#@param`` forms, readable views of what a step produced, and the Colab keep-alive.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .runtime import COLAB, runtime, tpu_vm_present

__all__ = ["ParameterPanel", "choose_training_backend", "describe_runtime", "keep_alive_script", "local_copy",
           "nvidia_gpus", "runtime", "set_keep_alive", "show_instances"]


def describe_runtime() -> str:
    """One paragraph: where we run, which accelerator is visible, cores, memory and free disk."""
    import psutil

    gpus = nvidia_gpus()
    accelerator = "TPU VM" if tpu_vm_present() else (f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "CPU only")
    disk = shutil.disk_usage(os.getcwd())
    return (f"runtime: {runtime()}; accelerator: {accelerator}; {os.cpu_count()} CPU cores; "
            f"{psutil.virtual_memory().total / 2**30:.1f} GiB memory; {disk.free / 2**30:.1f} GiB free disk in "
            f"{os.getcwd()}")


def choose_training_backend(requested: str = "auto") -> str:
    """The training backend for this runtime, said with its reason; pass it to ``train(backend=...)``.

    On a TPU runtime whose image has JAX and no TPU build of TensorFlow (Colab's, Kaggle's) this is
    ``jax``: training then needs no TensorFlow install (skip ``setup_tpu_runtime``). Elsewhere, with
    TensorFlow and bert4keras installed, ``tensorflow``.
    """
    from .backend import JAX, choose_backend

    backend, why = choose_backend(requested)
    extra = ": Keras 3 on JAX, no TensorFlow install needed" if backend == JAX else ""
    print(f"Training backend: {backend} ({why}){extra}.")
    return backend


def nvidia_gpus() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    import subprocess

    result = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                            text=True)
    return [line.strip() for line in result.stdout.splitlines() if line.strip()] if result.returncode == 0 else []


class ParameterPanel:
    """The notebook's parameters as attributes; outside Colab also as editable ipywidgets controls.

    Colab renders ``#@param`` comments as a form; Kaggle and Jupyter do not. There the panel shows one
    control per parameter, and reading ``panel.name`` later returns what the user set.
    """

    def __init__(self, values: Mapping[str, Any], show: bool | None = None):
        self._values = dict(values)
        self._widgets: dict[str, Any] = {}
        if show is None:
            show = runtime() != COLAB
        if show:
            self._display()

    def _display(self) -> None:
        try:
            import ipywidgets as widgets
            from IPython.display import display
        except ImportError:  # pragma: no cover - ipywidgets is a dependency
            return
        for name, value in self._values.items():
            if isinstance(value, bool):
                widget = widgets.Checkbox(value=value, description=name)
            elif isinstance(value, int):
                widget = widgets.IntText(value=value, description=name)
            elif isinstance(value, float):
                widget = widgets.FloatText(value=value, description=name)
            else:
                widget = widgets.Text(value=str(value), description=name)
            widget.style = {"description_width": "initial"}
            self._widgets[name] = widget
        display(widgets.VBox(list(self._widgets.values())))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._widgets:
            return self._widgets[name].value
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no parameter named {name!r}") from None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._values}


def show_instances(data_dir: str | os.PathLike, count: int = 3, split: str = "train") -> str:
    """A few pretraining instances decoded to text: masked tokens as [MASK]->answer, segments and NSP label."""
    from .data.data_folder import VOCAB, load_manifest
    from .data.tfrecord import decode_example, read_records
    from .data.tokenization import load_tokenizer

    data_dir = Path(data_dir)
    manifest = load_manifest(data_dir)
    tokenizer = load_tokenizer(str(data_dir / VOCAB), do_lower_case=manifest.settings["do_lower_case"])
    shown = []
    for record in read_records(data_dir / manifest.files(split)[0]):
        example = decode_example(record)
        length = int(example["input_mask"].sum())
        tokens = tokenizer.convert_ids_to_tokens(example["input_ids"][:length])
        for position, answer, weight in zip(example["masked_lm_positions"], example["masked_lm_ids"],
                                            example["masked_lm_weights"], strict=True):
            if weight > 0:
                tokens[position] = f"{tokens[position]}->{tokenizer.inv_vocab[answer]}"
        label = "random next" if example["next_sentence_labels"][0] else "actual next"
        shown.append(f"[{label}] " + " ".join(tokens))
        if len(shown) == count:
            break
    return "\n\n".join(shown)


def local_copy(path: str, local_dir: str) -> str:
    """A local path for ``path``: itself when local (or a mounted Drive folder), else a verified copy.

    Training reads shards from local disk (both free TPU platforms are TPU VMs with one); a
    ``gs://`` data folder is synced down once, and a re-run only fetches what changed.
    """
    from . import storage

    if not storage.is_gcs_url(path):
        return path
    print(storage.sync(path, local_dir, progress=True).text())
    return local_dir


# -- Colab keep-alive (best-effort) -----------------------------------------------------------------
KEEP_ALIVE_JS = """
(function () {
  // tpu_pretrain keep-alive: clicks Colab's connect button every %(seconds)d s. Unofficial: Colab may
  // change its page at any time, and it cannot extend the 12-hour limit.
  if (window.__tpuPretrainKeepAlive) { clearInterval(window.__tpuPretrainKeepAlive); }
  window.__tpuPretrainKeepAlive = setInterval(function () {
    var root = (window.top && window.top.document) || document;
    var button = root.querySelector("colab-connect-button");
    var inner = button && button.shadowRoot ? button.shadowRoot.querySelector("#connect") : null;
    (inner || button || {click: function () {}}).click();
  }, %(seconds)d * 1000);
})();
"""

STOP_KEEP_ALIVE_JS = """
if (window.__tpuPretrainKeepAlive) {
  clearInterval(window.__tpuPretrainKeepAlive);
  window.__tpuPretrainKeepAlive = null;
}
"""


def keep_alive_script(seconds: int = 60) -> str:
    """The JavaScript the old tutorials pasted into the browser console (works there when the cell's does not)."""
    return KEEP_ALIVE_JS % {"seconds": int(seconds)}


def set_keep_alive(on: bool, seconds: int = 60) -> str:
    """Switch the Colab keep-alive on or off from a notebook cell; returns what was done.

    Best-effort: it injects a connect-button clicker into the page. Colab may change its page (or
    sandbox output frames) at any time; if it stops working, paste :func:`keep_alive_script` into the
    browser console. Either way the session still ends after 12 hours: resume is the real safeguard.
    """
    if runtime() != COLAB:
        return "Not on Colab: no keep-alive needed."
    from IPython.display import Javascript, display

    display(Javascript(keep_alive_script(seconds) if on else STOP_KEEP_ALIVE_JS))
    return ("Keep-alive on (best-effort, unofficial): it clicks Colab's connect button every "
            f"{seconds} s." if on else "Keep-alive off.")
