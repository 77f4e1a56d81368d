"""TensorFlow on a TPU VM: the pinned install, connecting to the TPU, and the diagnosis when it fails.

Free TPUs (Colab v5e-1, Kaggle v5e-8/v3-8) are TPU VMs whose stock TensorFlow cannot see the TPU:
:func:`setup_tpu_runtime` installs a pinned ``tensorflow-tpu`` with its matching ``libtpu``, and
:func:`diagnose_tpu` says exactly what is wrong when no TPU is found, and what to run.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import tensorflow as tf

from ..environment import installed_version, minor_version
from ..errors import UserInputError
from ..runtime import tpu_vm_present

log = logging.getLogger(__name__)

# Known-good pair for TPU VMs; tf-keras must share TensorFlow's minor version (bert4keras needs Keras 2).
TENSORFLOW_TPU_VERSION = "2.18.0"
LIBTPU_VERSION = "2.18.0"
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"


class AcceleratorError(UserInputError):
    """The requested accelerator is not usable; the message says why and what to run."""


def tpu_setup_commands() -> list[list[str]]:
    """The pip commands that give this Python a TensorFlow that sees the TPU (pinned, matching)."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    minor = ".".join(TENSORFLOW_TPU_VERSION.split(".")[:2])
    return [
        [sys.executable, "-m", "pip", "uninstall", "--quiet", "-y", "tensorflow", "tensorflow-cpu", "tf-keras"],
        pip + [f"tensorflow-tpu=={TENSORFLOW_TPU_VERSION}", f"libtpu=={LIBTPU_VERSION}", "-f", LIBTPU_INDEX],
        pip + [f"tf-keras=={minor}.*"],
    ]


def diagnose_tpu(error: Exception | None = None) -> str:
    """Why TensorFlow sees no TPU, in order of likelihood, with the fix."""
    commands = "\n".join("  " + " ".join(c[2:] if c[0] == sys.executable else c) for c in tpu_setup_commands())
    setup = (f"Run tpu_pretrain.accelerator.setup_tpu_runtime() (or these, then restart the runtime):\n"
             f"  python -m {commands.strip()}")
    if not tpu_vm_present():
        return ("No TPU is attached to this machine. On Colab: Runtime > Change runtime type > TPU (v5e-1); on "
                "Kaggle: Settings > Accelerator > TPU VM v5e-8 (or v3-8). Then restart and run again. To train "
                "on what is here instead, use --accelerator auto (GPU or CPU).")
    tf_tpu = installed_version("tensorflow-tpu")
    libtpu = installed_version("libtpu", "libtpu-nightly")
    if not tf_tpu:
        return (f"A TPU is attached, but TensorFlow {tf.__version__} is not the TPU build (tensorflow-tpu is not "
                f"installed; the Colab/Kaggle images ship a TensorFlow that cannot see the TPU). " + setup)
    if not libtpu:
        return f"tensorflow-tpu {tf_tpu} is installed but libtpu is missing. " + setup
    if minor_version(libtpu) != minor_version(tf_tpu):
        return (f"libtpu {libtpu} does not match tensorflow-tpu {tf_tpu} (TensorFlow needs the libtpu built "
                f"with it). " + setup)
    if tf.__version__ != tf_tpu:
        return (f"The running TensorFlow is {tf.__version__} but tensorflow-tpu {tf_tpu} is installed: another "
                "TensorFlow shadows it. Restart the runtime; if it persists, " + setup)
    detail = f" ({type(error).__name__}: {error})" if error else ""
    return ("TensorFlow with TPU support is installed but could not initialise the TPU" + detail + ". Another "
            "process may hold it (only one process can use a TPU: restart the runtime, close other notebooks), "
            "or the TPU runtime version differs; restart and try again.")


def setup_tpu_runtime(install: bool = True) -> str:
    """Make this environment's TensorFlow see the TPU: check the pinned pair, install it if asked.

    Returns a one-line status. After an install the Python process must restart (TensorFlow is
    already loaded), which the message says.
    """
    tf_tpu, libtpu = installed_version("tensorflow-tpu"), installed_version("libtpu", "libtpu-nightly")
    if tf_tpu == TENSORFLOW_TPU_VERSION and libtpu and minor_version(libtpu) == minor_version(tf_tpu):
        return f"tensorflow-tpu {tf_tpu} with libtpu {libtpu}: ready."
    if not install:
        return diagnose_tpu()
    for command in tpu_setup_commands():
        log.info("Running: %s", " ".join(command))
        subprocess.run(command, check=True)
    return (f"Installed tensorflow-tpu {TENSORFLOW_TPU_VERSION} with libtpu {LIBTPU_VERSION}. Restart the "
            "runtime (Colab: Runtime > Restart session; Kaggle: Run > Restart) and run again.")


def connect_tpu(tpu_name: str) -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_name or "local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    except Exception as exc:  # the TPU stack raises many types; the diagnosis names the cause
        raise AcceleratorError(diagnose_tpu(exc)) from exc
