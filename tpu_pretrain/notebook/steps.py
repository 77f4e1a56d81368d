"""The steps that need TensorFlow (train, evaluate, export) run as ``tpu-pretrain`` processes of their own.

A notebook kernel never imports TensorFlow: on a TPU VM the processes run in the TPU environment (a kernel
holding the TPU would need a restart after every run, and Kaggle's "Save & Run All" could not work), and
everywhere the cell stays responsive and shows a progress bar, the package's own messages (resuming from,
saved checkpoint, evaluations) and, while training, the curves as they grow. Interrupting the cell asks the
process to save and stop, as Ctrl-C does in a terminal. A run whose local folder is gone (a new runtime)
is first fetched from its durable copy.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .. import storage
from ..backend import AUTO, TENSORFLOW
from ..cli import EXIT_FAILED, EXIT_STOPPED_EARLY
from ..config import TRAIN, step_settings
from ..core.run_folder import RunFolder, config_file_at
from ..errors import UserInputError
from ..runtime import COLAB, KAGGLE, runtime, tpu_vm_present
from ..storage import drive
from . import places
from .params import Parameters
from .progress import StreamedLines, TrainingProgress
from .views import LiveCurves

# Settings the notebook decides itself (where things are); the others are passed on as they were set.
PLACED = ("data_dir", "output_dir", "mirror_dir", "vocab_file")


@functools.cache
def tpu_environment():
    """The TPU environment (built once per session, then reused), for the ``tpu-pretrain`` processes on a TPU VM."""
    from ..tf_backend.setup.tpu_env import prepare_tpu_environment

    return prepare_tpu_environment()


def run(arguments: list[str], backend: str | None = None, curves: LiveCurves | None = None,
        refresh_seconds: float = 30.0) -> int:
    """``tpu-pretrain ARGUMENTS`` for a run of ``backend``, streamed; its exit code.

    On a TPU VM a TensorFlow run's steps take the TPU environment's Python (with its own variables); everywhere
    else, and for the JAX backend (the image's own JAX), this kernel's.
    """
    if tpu_vm_present() and backend == TENSORFLOW:
        from ..tf_backend.setup.tpu_env import child_environment

        environment = tpu_environment()
        return stream(environment.command(arguments), curves, refresh_seconds, child_environment(environment.path))
    return stream([sys.executable, "-m", "tpu_pretrain", *arguments], curves, refresh_seconds, dict(os.environ))


def run_or_raise(arguments: list[str], backend: str | None = None) -> None:
    """:func:`run`, raising with the step's name when it fails (its messages are already in the cell)."""
    returncode = run(arguments, backend)
    if returncode:
        raise UserInputError(f"`tpu-pretrain {arguments[0]}` failed (exit {returncode}); its messages are above.")


def train(params: Parameters, data_dir: str, resume_from: str = "", refresh_seconds: float = 30.0) -> str:
    """Train (or continue) the run ``params.run_name`` with the backend ``prepare_runtime`` settled; return its
    local folder.

    ``data_dir`` is the durable data folder; ``resume_from`` a copy of the run to continue when this runtime has
    none (default: where ``places.run_source`` finds it: the project's mirror, or on Kaggle an attached output).
    """
    mirror, run_dir = places.run_mirror(params), places.local_run_dir(params)
    fetch_if_missing(run_dir, resume_from or places.run_source(params))
    backend = params.get("backend", AUTO)
    run_flags = ["--data_dir", places.local_data(data_dir), "--output_dir", run_dir, *settings_flags(params, backend)]
    arguments = ["train", *run_flags, *(["--mirror_dir", mirror] if run_dir != mirror else [])]
    print(f"Training run {params.run_name!r} in {run_dir}" + (f", mirrored to {mirror}" if run_dir != mirror else ""))
    if tpu_vm_present() and backend != TENSORFLOW:
        check_fits(run_flags)
    if run_dir != mirror:
        sign_in_to_delete_for_good(mirror)
    returncode = run(arguments, backend, LiveCurves(run_dir), refresh_seconds)
    if returncode == EXIT_STOPPED_EARLY:
        print(f"Stopped before the end (the session's deadline, an interrupt, or a durable copy in {mirror} that fell "
              f"behind: the messages above say which, and what to fix). {how_to_continue(params)}")
    elif returncode:
        raise UserInputError(f"Training failed (exit {returncode}); its last messages are above.")
    return run_dir


def check_fits(train_flags: list[str]) -> None:
    """The run's step compiled for this runtime's TPU before the first step (``tpu-pretrain plan``, the real compile on
    the chips): settings that cannot fit stop here with the batch that does, not after the TPU's set-up."""
    print("Checking that these settings fit the TPU (one compile of the training step)...", flush=True)
    returncode = run(["plan", *train_flags])
    if returncode == EXIT_FAILED:
        raise UserInputError("These settings do not fit this TPU's memory: the plan above names the train_batch_size "
                             "(or gradient_accumulation_steps) that does. Set it in the parameters and run again.")
    if returncode:
        print("Could not check the fit (the messages above say why); training goes on, and says so if it does not.")


def plan_for_tpu(params: Parameters, tpu: str) -> str:
    """On a runtime without a TPU: the run's settings compiled for ``tpu`` (``tpu-pretrain plan``), so the TPU runtime
    starts with settings known to fit. Where no TPU compiler is installed, Colab and Kaggle get the newest
    ``jax[tpu]`` first: older compilers need far more host memory (over 18 GB for BERT-base with libtpu 0.0.23, more
    than a CPU runtime has), and a CPU runtime is discarded when the user switches to the TPU anyway."""
    if importlib.util.find_spec("libtpu") is None:
        if runtime() not in (COLAB, KAGGLE):
            return f"To plan for a {tpu} here, install the TPU compiler (pip install -U 'jax[tpu]') and run this again."
        print(f"Installing the TPU compiler (jax[tpu]) to plan for a {tpu}...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-U", "jax[tpu]"], check=True)
    shapes = [f"--{name}={params.get(name)}" for name in ("max_seq_length",) if params.get(name, "")]
    returncode = run(["plan", "--tpu", tpu, *settings_flags(params, backend="jax"), *shapes])
    return {0: f"Planned for a {tpu}: these settings fit (above).", EXIT_FAILED: f"These settings do NOT fit a {tpu}: "
            "the plan above names what does."}.get(returncode, f"Could not plan for a {tpu}: see above.")


def how_to_continue(params: Parameters) -> str:
    """What to do in the next session to continue this run, on this platform."""
    if runtime() == KAGGLE and not places.is_remote(places.run_mirror(params)):
        return ("To continue: let this version finish saving (Save Version > Save & Run All keeps the output), then "
                "in a new session attach this notebook's output as an input (Add Input > Your Work) and run it "
                f"again: it finds the run {params.run_name!r} there and continues it (or give its folder as "
                "resume_from in 05_resume).")
    return "Run this notebook (or 05_resume) again to continue."


def sign_in_to_delete_for_good(mirror: str) -> None:
    """On Colab, a run mirrored to Drive: sign in (Colab asks once) so that pruned checkpoints are deleted for good;
    deleted through the mount alone they would go to Drive's bin and keep counting against the quota."""
    if runtime() != COLAB or not drive.is_drive_path(mirror) or importlib.util.find_spec("google.colab") is None:
        return
    from google.colab import auth  # type: ignore[import-not-found]

    try:
        auth.authenticate_user()
    except Exception as exc:  # declined or failed: pruning still frees the space, leaving empty files in the bin
        print(f"No Drive sign-in ({exc}): checkpoints pruned from Drive are emptied before they are deleted, so its "
              "bin keeps them without their bytes.")
        return
    print("Signed in with Colab's sign-in, so that checkpoints pruned from Drive are deleted for good, not kept in "
          "its bin.")


def fetch_run(params: Parameters, source: str) -> str:
    """The run ``params.run_name`` on this runtime's disk, brought from ``source`` if it is not here yet."""
    run_dir = places.local_run_dir(params)
    fetch_if_missing(run_dir, source)
    return run_dir


def evaluate(run_dir: str, data_dir: str, sentences: list[str], top_k: int = 5) -> str:
    """Held-out figures (when the data is reachable) and fill-mask for the run's newest checkpoint."""
    arguments = ["evaluate", run_dir, "--top_k", str(top_k)]
    for sentence in sentences:
        arguments += ["--sentence", sentence]
    if data_dir and storage.exists(data_dir):
        arguments += ["--data_dir", places.local_eval_data(data_dir)]
    else:
        print(f"No data at {data_dir!r}: held-out figures are skipped (fill-mask still runs).")
    run_or_raise(arguments, RunFolder(run_dir).recorded_backend())
    return f"Results saved in {RunFolder(run_dir).evaluation_file}."


def export(run_dir: str, destination: str | os.PathLike) -> Path:
    """The run's newest checkpoint as ``destination/hf`` (Hugging Face) and ``destination/tf`` (Google)."""
    destination = Path(destination)
    for format in ("hf", "tf"):
        run_or_raise(["export", run_dir, "--format", format, "--output", str(destination / format)],
                     RunFolder(run_dir).recorded_backend())
    return destination


def fetch_if_missing(run_dir: str, source: str) -> None:
    """On a new runtime, bring the run back from its durable copy so training continues it."""
    from ..core.mirror import fetch_run

    if RunFolder(run_dir).config_file.is_file() or not storage.exists(config_file_at(source)):
        return
    fetch_run(source, run_dir)
    print(f"Fetched the run from {source}: it continues from its newest checkpoint.")


def settings_flags(params: Parameters, backend: str = "") -> list[str]:
    """The notebook's training settings as ``tpu-pretrain train`` flags (empty strings left out)."""
    flags = [f"--backend={backend}"] if backend else []
    for name, value in params.as_dict().items():
        if name == "backend" and backend:
            continue
        if name not in step_settings(TRAIN) or name in PLACED or value == "":
            continue
        flags.append(f"--{name}={str(value).lower() if isinstance(value, bool) else value}")
    return flags


def stream(command: list[str], curves: LiveCurves | None, refresh_seconds: float, env: dict[str, str]) -> int:
    """Run ``command``: its progress lines as a bar and the newest line in full (:mod:`.progress`), its other
    lines printed, the curves redrawn; its exit code."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(env, PYTHONUNBUFFERED="1"))
    progress, last_refresh = TrainingProgress(), time.monotonic()
    printed = StreamedLines(progress)
    try:
        for line in process.stdout:
            if not progress.feed(line):
                printed.add(line.rstrip())
            if curves is not None and time.monotonic() - last_refresh > refresh_seconds:
                curves.refresh()
                last_refresh = time.monotonic()
    except KeyboardInterrupt:  # the cell was interrupted: ask for a clean stop, and wait for the last save
        process.send_signal(signal.SIGINT)
        print("Interrupted: saving a checkpoint and stopping...", flush=True)
        for line in process.stdout:
            printed.add(line.rstrip())
    finally:
        progress.close()
    if curves is not None:
        curves.refresh()
    return process.wait()
