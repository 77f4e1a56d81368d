"""The one call that makes a fresh Colab, Kaggle or Jupyter runtime ready for a notebook.

Every notebook may run on a machine of its own, so each starts the same way: its parameters are checked
(no placeholder left), the stack it needs is installed where missing (with visible progress and a clear
error), Google Drive is mounted when one of its paths is on Drive, and Cloud Storage is signed in to when
one is a ``gs://`` URL, and the training backend is settled (a run's own; JAX on a TPU). Nothing here
imports TensorFlow.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from .. import storage
from ..backend import AUTO, JAX, jax_installed
from ..core.run_folder import backend_in_settings, config_file_at
from ..errors import UserInputError
from ..pinned_sets import CPU_GPU_SET, NO_DEPS
from ..runtime import COLAB, KAGGLE, runtime, tpu_vm_present
from ..storage import drive
from . import places
from .params import Parameters, check_placeholders, parameters
from .views import describe_runtime

NEEDS = ("data", "training", "run")


def prepare_runtime(namespace, needs: str = "data") -> Parameters:
    """Check this notebook's parameters and make the runtime ready for them; returns the parameters.

    ``needs``: ``data`` (corpus, vocab, shards, uploads: no training backend), ``training`` (a run is trained,
    new or continued) or ``run`` (an existing run is continued, evaluated or exported: its durable copy is
    checked before anything is installed). For the last two the training backend is settled here (the run's
    own, else JAX on a TPU, else the machine's) and only what it needs is installed; the kernel itself never
    imports TensorFlow.
    """
    if needs not in NEEDS:
        raise ValueError(f"needs must be one of {NEEDS}, not {needs!r}")
    params = parameters(namespace)
    check_placeholders(params)
    print(describe_runtime())
    if params.get("require_tpu") and not tpu_vm_present():
        raise UserInputError(no_tpu_message())
    locations = params.paths().values()
    if any(drive.is_drive_path(p) for p in locations):
        print(mount_drive())
    if any(str(p).startswith("gs://") for p in locations):
        print(sign_in_to_cloud_storage(params.get("kaggle_secret_name", "")))
    backend = None
    if needs != "data":
        source = places.run_source(params)
        if needs == "run":
            places.require(source, "The run's durable copy", "03_train_colab_tpu or 04_train_kaggle_tpu")
        backend = settle_backend(params.get("backend", AUTO), source)
        params.set("backend", backend)
    print(ensure_stack(backend))
    print("Parameters:\n" + repr(params))
    return params


def no_tpu_message() -> str:
    """How to get the TPU this notebook is for, on this platform."""
    how = {KAGGLE: "in the notebook's Settings (or the right panel) choose Accelerator > TPU VM v5e-8; Kaggle offers "
                   "accelerators only to phone-verified accounts (Settings > Phone verification). A headless \"Save "
                   "& Run All\" runs on the accelerator saved with the notebook, so save it with the TPU selected",
           COLAB: "Runtime > Change runtime type > TPU (v5e-1), then run the notebook again"}
    return (f"No TPU on this runtime: {how.get(runtime(), 'run it on a TPU VM')}. To train on this runtime's GPU or "
            "CPU instead (much slower for BERT-base), set require_tpu = False in the parameters.")


def settle_backend(requested: str, source: str | None = None) -> str:
    """The backend a notebook trains (or evaluates) with, said with its reason: a run keeps the backend that
    started it; on a TPU VM ``auto`` takes the image's own JAX when its TensorFlow (if any) cannot use the TPU,
    with nothing to install; elsewhere ``auto`` stays for the ``tpu-pretrain`` process to decide."""
    from ..backend import choose_backend

    config = config_file_at(source) if source else None
    recorded = backend_in_settings(json.loads(storage.read_text(config))) if config and storage.exists(config) else None
    if recorded:
        if requested not in (AUTO, recorded):
            raise UserInputError(f"backend={requested!r}, but the run at {source} was started with {recorded} and "
                                 f"continues on it: set backend to auto (or {recorded}), or give a new run_name.")
        print(f"Backend: {recorded} (the backend this run was started with).")
        return recorded
    if requested == AUTO and tpu_vm_present():
        backend, why = choose_backend(AUTO)
        print(f"Backend: {backend} ({why}).")
        return backend
    return requested


def ensure_stack(backend: str | None) -> str:
    """Install what the training ``backend`` needs when it is missing (None: a data step); one line saying so."""
    from ..environment import EnvironmentSetupError, check_dependencies, installed_version

    if backend is None:
        return "Stack: the data steps need no training backend; nothing to install."
    if backend == JAX:
        if not jax_installed():
            pip_install(["jax[tpu]" if tpu_vm_present() else "jax", "keras>=3.5"])
        return (f"Stack: JAX {installed_version('jax')} and Keras {installed_version('keras')} (the JAX backend): "
                "ready, no TensorFlow needed.")
    if tpu_vm_present():
        return ("Stack: the run trains with TensorFlow, whose TPU build gets an environment of its own (Python 3.12, "
                "about 2 GB, a few minutes once per session), built when first needed; this kernel never imports it.")
    try:
        check_dependencies()
    except EnvironmentSetupError as problem:
        print(f"Installing the TensorFlow stack ({problem})...")
        pip_install(["-r", str(CPU_GPU_SET)])
        pip_install(["--no-deps", "-r", str(NO_DEPS)])
        check_dependencies()
    return (f"Stack: tensorflow {installed_version('tensorflow', 'tensorflow-cpu')}, tf-keras "
            f"{installed_version('tf-keras')}, bert4keras {installed_version('bert4keras')}: ready.")


def pip_install(arguments: list[str]) -> None:
    """``pip install`` into this kernel's Python, its progress shown, its failure an error with pip's words."""
    command = [sys.executable, "-m", "pip", "install", "--progress-bar", "off", *arguments]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in process.stdout:
        tail = (tail + [line.rstrip()])[-30:]
        if line.startswith(("Collecting", "Installing", "Successfully", "ERROR")):
            print("  " + line.rstrip(), flush=True)
    if process.wait():
        raise UserInputError(f"`{' '.join(command[2:])}` failed (exit {process.returncode}):\n" + "\n".join(tail))
    print(f"  done in {time.perf_counter() - started:.0f} s")


def mount_drive() -> str:
    """Mount Google Drive (Colab asks the user to allow it once)."""
    if runtime() != COLAB:
        raise UserInputError(f"A parameter names a folder under {drive.DRIVE_ROOT}, which only exists on Colab. "
                             "Here use a local folder, a gs:// bucket" +
                             (", or Kaggle's /kaggle/working and /kaggle/input." if runtime() == KAGGLE else "."))
    return f"Google Drive mounted at {drive.mount_drive()}."


def sign_in_to_cloud_storage(kaggle_secret_name: str = "") -> str:
    """Credentials for Cloud Storage on this runtime; says which were used, never the key itself."""
    from ..storage import auth

    if runtime() == KAGGLE and kaggle_secret_name:
        path = auth.use_kaggle_secret(kaggle_secret_name)
        email = json.loads(Path(path).read_text()).get("client_email", "a service account")
        used = (f"Signed in to Cloud Storage as {email} with the Kaggle secret {kaggle_secret_name!r} (its key was "
                f"written, readable only by you, to {path}; it is never printed or copied into a run).")
    elif runtime() == KAGGLE:
        raise UserInputError("A parameter is a gs:// URL but kaggle_secret_name is empty: store a service-account "
                             "key as a Kaggle secret (Add-ons > Secrets) and give its name.")
    elif runtime() == COLAB and importlib.util.find_spec("google.colab") is not None and not auth.emulator_host():
        from google.colab import auth as colab_auth  # type: ignore[import-not-found]

        colab_auth.authenticate_user()
        used = "Signed in to Cloud Storage with your Google account (Colab's sign-in)."
    else:
        used = "Cloud Storage credentials: " + auth.describe(auth.current_credentials())
    return used
