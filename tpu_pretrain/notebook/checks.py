"""00_setup's checks: will training work on this accelerator, and is the durable folder usable and private?"""

from __future__ import annotations

from .. import storage
from ..runtime import KAGGLE, runtime, tpu_vm_present
from ..storage import drive
from . import places
from .params import Parameters
from .views import describe_runtime


def check_accelerator(params: Parameters) -> str:
    """What will train here; on a TPU VM, the backend training will use measured on it (JAX: the run's model size
    and batch, sequences/s and MFU, saved to ``project_dir/accelerator_check.json``; TensorFlow: its TPU
    environment installed and the TPU probed)."""
    if not tpu_vm_present():
        said = (describe_runtime() + " No TPU here: training uses " + ("the GPU(s)." if "GPU" in describe_runtime()
                else "the CPU (fine for the quickstart; for real pretraining pick a TPU runtime)."))
        if params.get("plan_for_tpu", ""):
            from .steps import plan_for_tpu

            said += "\n" + plan_for_tpu(params, params.get("plan_for_tpu"))
        return said
    if not params.get("probe_tpu", True):
        return "TPU VM found; probe skipped."
    from ..backend import JAX
    from .runtime_setup import settle_backend
    from .steps import run

    backend = settle_backend(params.get("backend", "auto"))
    if backend == JAX:
        saved = storage.join(places.project_dir(params), "accelerator_check.json")
        returncode = run(["tpu-check", "--backend", JAX, "--model_size", params.get("model_size", "L12-H768"),
                          "--train_batch_size", str(params.get("train_batch_size", 128)), "--save", saved], JAX)
        return "TPU ready: training will use it with JAX." if returncode == 0 else "The TPU is not usable: see above."
    from .steps import tpu_environment

    returncode = tpu_environment().run(["tpu-check", "--backend", "tensorflow"])  # on failure, the diagnosis follows
    return ("TPU ready: training with TensorFlow will use it." if returncode == 0 else
            "The TPU is not usable yet: see above.")


def check_project(params: Parameters) -> str:
    """Where the project's data, runs and exports will be kept, and whether that place works."""
    project = places.project_dir(params)
    lines = [f"Durable folder: {project} (data/, runs/<name>/, exports/<name>/)."]
    if storage.is_gcs_url(project):
        from ..storage.security import check_storage

        report = check_storage(project, data_url=storage.join(project, "data"), run_url=storage.join(project, "runs"))
        lines.append(report.text())
    else:
        free = storage.free_space(project)
        where = "Google Drive" if drive.is_drive_path(project) else "this runtime's disk"
        lines.append(f"Free space on {where}: {free / 2**30:.1f} GiB." if free is not None else "")
        if runtime() == KAGGLE:
            lines.append("On Kaggle this is the notebook's output: it is kept when you save a version, and a later "
                         "notebook reads it after you attach that output as an input (under /kaggle/input).")
    return "\n".join(line for line in lines if line)
