"""Where this process runs: Colab, Kaggle or elsewhere, and whether the machine is a TPU VM.

One set of rules for every part that cares (Drive mounting, the session deadline, the notebooks, the
choice of accelerator). It reads only the environment and the file system and never imports
TensorFlow, so it can answer before TensorFlow is installed or configured.
"""

from __future__ import annotations

import glob
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

COLAB, KAGGLE, LOCAL = "colab", "kaggle", "local"

# Variables a TPU VM's runtime sets (Colab: COLAB_TPU_ADDR on the old TPU nodes, TPU_ACCELERATOR_TYPE on
# TPU VMs; Kaggle's v5e-8: ISTPUVM=1 and TPU_PROCESS_ADDRESSES=local; Cloud TPU VMs: TPU_NAME...).
TPU_ENVIRONMENT = ("TPU_ACCELERATOR_TYPE", "ISTPUVM", "TPU_PROCESS_ADDRESSES", "TPU_WORKER_ID", "TPU_NAME",
                   "COLAB_TPU_ADDR", "KAGGLE_TPU")


def in_colab() -> bool:
    """A Google Colab runtime (its variables, its module, or its sample-data folder)."""
    return ("google.colab" in sys.modules or any(k in os.environ for k in ("COLAB_RELEASE_TAG", "COLAB_GPU"))
            or Path("/content/sample_data").is_dir())


def in_kaggle() -> bool:
    """A Kaggle notebook (its variables or its working folder)."""
    variables = ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE")
    return any(k in os.environ for k in variables) or Path("/kaggle/working").is_dir()


def runtime() -> str:
    """``"colab"``, ``"kaggle"`` or ``"local"`` (any other Jupyter, or a script)."""
    if in_colab():
        return COLAB
    if in_kaggle():
        return KAGGLE
    return LOCAL


def tpu_chips_present() -> bool:
    """TPU chips on this machine: their device files (what libtpu opens), whatever the environment says."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def tpu_vm_present() -> bool:
    """True on a TPU VM (TPU device files or the runtime's variables), whatever TensorFlow can see."""
    return tpu_chips_present() or any(os.environ.get(k) for k in TPU_ENVIRONMENT)


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM stops the enclosed work as Ctrl-C does (``KeyboardInterrupt``), so a long step stops cleanly and
    says how to continue instead of dying silently; only the main thread can take signals, elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
