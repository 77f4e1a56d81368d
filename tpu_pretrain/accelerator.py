"""Find the accelerator (TPU VM, GPUs, CPU) and return its tf.distribute strategy and precision.

Free TPUs (Colab v5e-1, Kaggle v5e-8/v3-8) are TPU VMs whose stock TensorFlow cannot see the TPU:
:func:`setup_tpu_runtime` installs a pinned ``tensorflow-tpu`` with its matching ``libtpu``, and
:func:`diagnose_tpu` says exactly what is wrong when no TPU is found, and what to run.
"""

from __future__ import annotations

import glob
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field

import tensorflow as tf

from ._keras_env import installed_version
from .errors import UserInputError

log = logging.getLogger(__name__)

# Known-good pair for TPU VMs; tf-keras must share TensorFlow's minor version (bert4keras needs Keras 2).
TENSORFLOW_TPU_VERSION = "2.18.0"
LIBTPU_VERSION = "2.18.0"
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"


class AcceleratorError(UserInputError):
    """The requested accelerator is not usable; the message says why and what to run."""


@dataclass
class Accelerator:
    """What we train on and how: the strategy, mixed-precision policy and compilation choices."""

    kind: str  # "tpu", "gpu" or "cpu"
    strategy: tf.distribute.Strategy
    precision: str = "float32"  # "float32", "bfloat16" or "float16"
    jit_compile: bool = False
    devices: list[str] = field(default_factory=list)

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def policy_name(self) -> str:
        return {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}[self.precision]

    def default_steps_per_execution(self) -> int:
        """Many steps per host call on TPU (host round trips dominate), a few on GPU, 1 on CPU."""
        return {"tpu": 100, "gpu": 20}.get(self.kind, 1)

    def describe(self) -> str:
        return (f"{self.kind.upper()}: {self.num_replicas} replica(s), {self.precision}, "
                f"XLA {'on' if self.jit_compile else 'off'}")


def tpu_vm_present() -> bool:
    """True on a TPU VM (TPU device files or the runtime's environment), whatever TensorFlow sees."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    return any(os.environ.get(k) for k in ("TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR", "TPU_NAME",
                                           "KAGGLE_TPU"))


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
    if _minor(libtpu) != _minor(tf_tpu):
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
    if tf_tpu == TENSORFLOW_TPU_VERSION and libtpu and _minor(libtpu) == _minor(tf_tpu):
        return f"tensorflow-tpu {tf_tpu} with libtpu {libtpu}: ready."
    if not install:
        return diagnose_tpu()
    for command in tpu_setup_commands():
        log.info("Running: %s", " ".join(command))
        subprocess.run(command, check=True)
    return (f"Installed tensorflow-tpu {TENSORFLOW_TPU_VERSION} with libtpu {LIBTPU_VERSION}. Restart the "
            "runtime (Colab: Runtime > Restart session; Kaggle: Run > Restart) and run again.")


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _connect_tpu(tpu_name: str) -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_name or "local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    except Exception as exc:  # the TPU stack raises many types; the diagnosis names the cause
        raise AcceleratorError(diagnose_tpu(exc)) from exc


def gpu_supports_float16(gpus) -> bool:
    """float16 tensor cores need compute capability 7.0+ (T4: 7.5, V100: 7.0; P100: 6.0)."""
    for gpu in gpus:
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if not capability or tuple(capability) < (7, 0):
            return False
    return bool(gpus)


def detect_accelerator(requested: str = "auto", *, precision: str = "auto", jit_compile: str = "auto",
                       tpu_name: str = "local") -> Accelerator:
    """The strategy for ``requested`` ("auto", "tpu", "gpu", "cpu") and the precision to train in."""
    strategy, kind, devices = None, None, []
    if requested == "tpu" or (requested == "auto" and tpu_vm_present()):
        strategy, kind = _connect_tpu(tpu_name), "tpu"
        devices = [d.name for d in tf.config.list_logical_devices("TPU")]
    if strategy is None and requested in ("auto", "gpu"):
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            devices = [d.name for d in tf.config.list_logical_devices("GPU")]
            strategy, kind = tf.distribute.MirroredStrategy(devices), "gpu"
        elif requested == "gpu":
            raise AcceleratorError("accelerator=gpu but TensorFlow sees no GPU. On Colab/Kaggle pick a GPU "
                                   "runtime (T4); locally install a CUDA build of TensorFlow "
                                   "(pip install 'tensorflow[and-cuda]'). Or use --accelerator auto.")
    if strategy is None:
        cpus = tf.config.list_logical_devices("CPU")
        if len(cpus) > 1:  # several logical CPUs (tests) mimic several cores
            strategy = tf.distribute.MirroredStrategy([d.name for d in cpus])
        else:
            strategy = tf.distribute.get_strategy()
        kind, devices = "cpu", [d.name for d in cpus]
    if precision == "auto":
        if kind == "tpu":
            precision = "bfloat16"
        elif kind == "gpu" and gpu_supports_float16(tf.config.list_physical_devices("GPU")):
            precision = "float16"
        else:
            precision = "float32"
    jit = {"on": True, "off": False}.get(jit_compile, kind in ("tpu", "gpu"))
    acc = Accelerator(kind, strategy, precision, jit, devices)
    log.info("Accelerator: %s", acc.describe())
    return acc


def set_precision_policy(accelerator: Accelerator) -> None:
    """Set the global Keras mixed-precision policy before the model is built (float32 stays float32)."""
    tf.keras.mixed_precision.set_global_policy(accelerator.policy_name)


def matmul_peak_flops(n: int = 2048, dtype=tf.float32, seconds: float = 2.0) -> float:
    """Measured FLOP/s of a large n x n matmul: the practical peak the MFU is stated against."""
    import time

    a = tf.random.normal([n, n], dtype=dtype)
    b = tf.random.normal([n, n], dtype=dtype)
    matmul = tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)))
    matmul(a, b).numpy()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        matmul(a, b).numpy()
        runs += 1
    return 2.0 * n**3 * runs / (time.perf_counter() - start)
