"""Find the accelerator (TPU VM, GPUs, CPU) and return its tf.distribute strategy, and what was found for the run's
plan to decide its precision and XLA from (:mod:`..core.device_decision`).

A TPU is connected through :mod:`.tpu`, which also says exactly what is wrong when it cannot be used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from ..core.device_decision import DeviceDecision, FoundDevices, decide_jit, decide_precision
from ..runtime import tpu_vm_present
from .cluster import Cluster, find_cluster, multi_worker_strategy
from .framework import tf
from .tpu import AcceleratorError, connect_tpu, no_tpu_error

log = logging.getLogger(__name__)


@dataclass
class Accelerator:
    """What we train on and how: the strategy, mixed-precision policy and compilation choices."""

    kind: str  # "tpu", "gpu" or "cpu"
    strategy: tf.distribute.Strategy
    precision: str | None = None  # "float32", "bfloat16" or "float16"; None: the run's plan decides (:meth:`decided`)
    jit_compile: bool | None = None  # None: the run's plan decides
    devices: list[str] = field(default_factory=list)
    hardware: str = ""  # what a TPU system reported (type, chips, cores)
    cluster: Cluster | None = None  # several machines (MultiWorkerMirroredStrategy); None for one
    device_name: str = ""  # the TPU's type (v5litepod-8) or the GPU's name (Tesla T4), for its published peak

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run folder (the only one on one machine)."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def policy_name(self) -> str:
        return {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}[self.precision]

    def found(self) -> FoundDevices:
        """What was found, for the run's plan to decide from (:meth:`..core.resolve.RunPlan.on_devices`)."""
        gpus = tf.config.list_physical_devices("GPU") if self.kind == "gpu" else []
        return FoundDevices(self.kind, self.num_replicas,
                            bfloat16_native=self.kind == "tpu" or gpus_compute_at_least(gpus, (8, 0)),
                            float16_capable=gpus_compute_at_least(gpus, (7, 0)))

    def decided(self, decision: DeviceDecision) -> Accelerator:
        """This accelerator with the precision and XLA its run's plan decided."""
        return replace(self, precision=decision.precision, jit_compile=decision.jit_compile)

    def describe(self) -> str:
        hardware = f" ({self.hardware})" if self.hardware else ""
        return (f"{self.kind.upper()}{hardware}: {self.num_replicas} replica(s), {self.precision}, "
                f"XLA {'on' if self.jit_compile else 'off'}")


def gpus_compute_at_least(gpus, capability: tuple[int, int]) -> bool:
    """Every GPU of compute capability ``capability`` or above: float16 tensor cores need 7.0+ (T4: 7.5, V100: 7.0;
    P100: 6.0), native bfloat16 8.0+ (A100, L4, H100). False without GPUs."""
    for gpu in gpus:
        found = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if not found or tuple(found) < capability:
            return False
    return bool(gpus)


def gpu_name() -> str:
    """The first GPU's name as its driver gives it (``Tesla T4``, ``NVIDIA A100-SXM4-40GB``); empty if unknown."""
    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "") if gpus else ""


def detect_accelerator(requested: str = "auto", *, precision: str = "auto", jit_compile: str = "auto",
                       tpu_name: str = "local", worker_hosts: str = "", task_index: int = 0) -> Accelerator:
    """The accelerator :func:`find_accelerator` finds, with the precision and XLA that a run with these settings
    decides on it (:mod:`..core.device_decision`): for the probes and benchmarks that hand a trainer their own."""
    found = find_accelerator(requested, tpu_name=tpu_name, worker_hosts=worker_hosts, task_index=task_index)
    devices = found.found()
    acc = replace(found, precision=decide_precision("tensorflow", devices, precision)[0],
                  jit_compile=decide_jit("tensorflow", devices, jit_compile)[0])
    log.info("Accelerator: %s", acc.describe())
    return acc


def find_accelerator(requested: str = "auto", *, tpu_name: str = "local", worker_hosts: str = "",
                     task_index: int = 0) -> Accelerator:
    """The strategy for ``requested`` ("auto", "tpu", "gpu", "cpu"); its precision and XLA left to the run's plan.

    A TPU pod slice is one named TPU (``tpu_name``) whose hosts each feed their replicas; several GPU or CPU
    machines (``worker_hosts`` or ``TF_CONFIG``) train with MultiWorkerMirroredStrategy (:mod:`.cluster`).
    """
    strategy, kind, devices, hardware, name = None, None, [], "", ""
    cluster = find_cluster(worker_hosts, task_index) if requested != "tpu" else None
    if requested == "tpu" and not tpu_vm_present() and tpu_name in ("", "local"):
        raise no_tpu_error()
    if cluster is not None:
        strategy = multi_worker_strategy(cluster)
        kind = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
        devices = [d.name for d in tf.config.list_logical_devices(kind.upper())]
    elif requested == "tpu" or (requested == "auto" and tpu_vm_present()):
        strategy, tpu = connect_tpu(tpu_name)
        kind, hardware, name = "tpu", tpu.describe(), tpu.accelerator_type
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
    name = gpu_name() if kind == "gpu" else name
    return Accelerator(kind, strategy, None, None, devices, hardware, cluster, name)


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
