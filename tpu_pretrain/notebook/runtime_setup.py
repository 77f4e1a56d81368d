"""The one call that makes a fresh Colab, Kaggle or Jupyter runtime ready for a notebook.

Every notebook may run on a machine of its own, so each starts the same way: its parameters are checked
(no placeholder left), the stack it needs is installed where missing (with visible progress and a clear
error), Google Drive is mounted when one of its paths is on Drive, and Cloud Storage is signed in to when
one is a ``gs://`` URL. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from ..errors import UserInputError
from ..runtime import COLAB, KAGGLE, runtime, tpu_vm_present
from ..storage import drive
from ..tpu_stack import CPU_GPU_SET, NO_DEPS
from .params import Parameters, check_placeholders, parameters
from .views import describe_runtime

NEEDS = ("data", "tensorflow")


def prepare_runtime(namespace, needs: str = "data") -> Parameters:
    """Check this notebook's parameters and make the runtime ready for them; returns the parameters.

    ``needs``: ``data`` (corpus, vocab, shards, uploads: no TensorFlow) or ``tensorflow`` (training,
    evaluation, export: ``tpu-pretrain`` processes, on a TPU VM in the TPU environment, elsewhere with this
    runtime's Python, which gets the TensorFlow stack if it lacks it). The kernel itself never imports it.
    """
    if needs not in NEEDS:
        raise ValueError(f"needs must be one of {NEEDS}, not {needs!r}")
    params = parameters(namespace)
    check_placeholders(params)
    print(describe_runtime())
    print(ensure_stack(needs, params.get("backend", "auto")))
    places = params.paths().values()
    if any(drive.is_drive_path(p) for p in places):
        print(mount_drive())
    if any(str(p).startswith("gs://") for p in places):
        print(sign_in_to_cloud_storage(params.get("kaggle_secret_name", "")))
    print("Parameters:\n" + repr(params))
    return params


def ensure_stack(needs: str, backend: str = "auto") -> str:
    """Install what ``needs`` (and the training ``backend``) require when it is missing; one line saying so."""
    if needs == "data":
        return "Stack: the data steps need no TensorFlow; nothing to install."
    if tpu_vm_present() and backend != "tensorflow":
        return ("Stack: nothing to install now: training takes the image's own JAX unless the run was started with "
                "TensorFlow, whose TPU environment is then built when first needed.")
    if tpu_vm_present():
        from .steps import tpu_environment

        return f"Stack: TensorFlow runs in the TPU environment {tpu_environment().path}; this kernel never imports it."
    from ..environment import EnvironmentSetupError, check_dependencies, installed_version

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
