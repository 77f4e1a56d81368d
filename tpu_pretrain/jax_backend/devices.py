"""The JAX devices to train on, the data-parallel mesh over them, and what was found for the run's plan to decide the
precision from (:mod:`..core.device_decision`).

Every device is one data-parallel replica: the weights are replicated and each batch is split
along its examples (8 cores on Kaggle's v5e-8, 1 chip on Colab's v5e-1, the logical CPU devices of
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` in tests). Several processes (a TPU VM pod's hosts,
several GPU machines: :func:`.processes.start_processes`, JAX's own runtime) make one mesh over every process's devices;
each process holds the rows of a batch that land on its own devices (:meth:`Devices.local_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..core.device_decision import DeviceDecision, FoundDevices
from ..errors import UserInputError

try:  # jax >= 0.6
    from jax import shard_map as _shard_map

    _UNCHECKED = {"check_vma": False}
except ImportError:  # pragma: no cover - older JAX
    from jax.experimental.shard_map import shard_map as _shard_map

    _UNCHECKED = {"check_rep": False}

AXIS = "data"
# XLA's options for a GPU's steps. The dot merger joins GEMMs that share an operand: jax 0.11.2 (an H100's) joins each
# block's query and key projections and concatenates their gradients to feed the joined weight gradient (off: 1.016x
# measured on an H100). Triton's GEMMs: on a GPU XLA first wraps every GEMM as a Triton fusion, and where its
# autotuner then picks cuBLAS the GEMM comes back without the bias cuBLAS's epilogue would have added: the H100's
# BERT-base step added the query, key and value biases in 36 kernels of their own (1.3 ms of 47.5 of kernels). With
# them off every GEMM is cuBLAS's, bias included: 1.054x measured on an H100, and a shorter compile.
GPU_COMPILER_OPTIONS = {"xla_gpu_dot_merger_threshold_mb": 0, "xla_gpu_enable_triton_gemm": False}


@dataclass
class Devices:
    """Where and how a JAX run trains."""

    kind: str  # "tpu", "gpu" or "cpu"
    devices: list
    precision: str | None = None  # "float32", "bfloat16" or "float16" (loss scaled); None: the run's plan decides
    abstract: bool = False  # only compiled for, from shapes, never run on (:mod:`.plan`): a TPU described, or planned

    @property
    def num_replicas(self) -> int:
        return len(self.devices)

    @property
    def mesh(self) -> Mesh:
        return Mesh(self.devices, (AXIS,))

    @property
    def processes(self) -> int:
        """How many processes' devices the mesh spans (1 unless :func:`.processes.start_processes` joined several)."""
        return len({d.process_index for d in self.devices})

    def local_rows(self, rows: int) -> slice:
        """The rows of a ``rows``-row batch split over the mesh that land on this process's devices (contiguous:
        the mesh takes the devices in process order)."""
        spans = sorted((i[0].start or 0, rows if i[0].stop is None else i[0].stop)
                       for i in self.split().addressable_devices_indices_map((rows,)).values())
        return slice(spans[0][0], spans[-1][1])

    def put(self, tree, sharding):
        """Host arrays (the same on every process) onto ``sharding``: each process places only its own shards."""
        def one(x):
            x = np.asarray(x)
            return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
        return jax.tree.map(one, tree)

    def put_local_rows(self, tree):
        """This process's rows of a split batch (:meth:`local_rows`) as the global batch over the mesh."""
        sharding, count = self.split(), self.processes
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
            sharding, x, (x.shape[0] * count, *x.shape[1:])), tree)

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def split(self, axis: int = 0) -> NamedSharding:
        """Arrays split along ``axis`` (the examples) over the devices."""
        return NamedSharding(self.mesh, PartitionSpec(*([None] * axis), AXIS))

    def jit_options(self) -> dict:
        """``jax.jit``'s keyword arguments for the steps compiled for these devices: XLA's options on a GPU, none
        elsewhere."""
        return {"compiler_options": dict(GPU_COMPILER_OPTIONS)} if self.kind == "gpu" else {}

    @property
    def dtype_policy(self) -> str:
        """Keras's policy: float32 weights, computed in the precision (``mixed_*``) unless that is float32."""
        return "float32" if self.precision == "float32" else f"mixed_{self.precision}"

    def found(self) -> FoundDevices:
        """What was found (or described), for the run's plan to decide from
        (:meth:`..core.resolve.RunPlan.on_devices`)."""
        return FoundDevices(self.kind, self.num_replicas,
                            bfloat16_native=all(_supports_bfloat16(d) for d in self.devices),
                            float16_capable=all(compute_at_least(d, 7.0) for d in self.devices))

    def decided(self, decision: DeviceDecision) -> Devices:
        """These devices with the precision the run's plan decided."""
        return replace(self, precision=decision.precision)

    def describe(self) -> str:
        over = f" over {self.processes} processes" if self.processes > 1 else ""
        return f"{self.kind.upper()}: {self.num_replicas} device(s){over}, {self.precision}"


def fetch(tree):
    """Arrays of the devices on this host as NumPy: a replicated array from this process's own copy (an array over
    several processes cannot be fetched whole, and needs no gathering when every process holds all of it)."""
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if not x.sharding.is_fully_replicated:
                raise ValueError(f"An array of shape {x.shape} split over several processes cannot be read here.")
            return np.asarray(x.addressable_data(0))
        return np.asarray(jax.device_get(x))
    return jax.tree.map(one, tree)


def per_device(f, mesh, in_specs, out_specs):
    """``f`` run by each device of ``mesh`` on its own blocks of the operands (``shard_map``, unchecked: the Pallas
    kernels run this way declare nothing of how their results vary over the devices)."""
    return _shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **_UNCHECKED)


def _supports_bfloat16(device) -> bool:
    """TPUs and GPUs of compute capability 8.0+ (A100, L4, H100) compute bfloat16 natively; a T4 does not."""
    return device.platform == "tpu" or compute_at_least(device, 8.0)


def target_device(mesh=None):
    """The device the computation is compiled for: the mesh's first (a GPU or TPU described to the compiler, from a
    machine without one), else this process's first."""
    return mesh.devices.flat[0] if mesh is not None else jax.devices()[0]


def target_platform(mesh=None) -> str:
    """The platform the computation is compiled for (``tpu``, ``gpu`` or ``cpu``): the mesh's devices' (a TPU
    described for ``tpu-pretrain plan``, from a machine without one), else this process's default backend. Every
    platform-specific form of a layer asks this, so a step compiled for a TPU on a GPU machine takes the TPU's."""
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def compute_at_least(device, capability: float) -> bool:
    """A GPU of compute capability ``capability`` or above (float16 tensor cores: 7.0, native bfloat16 and cuDNN's
    fused attention: 8.0)."""
    try:
        return device.platform == "gpu" and float(getattr(device, "compute_capability", None)) >= capability
    except (TypeError, ValueError):
        return False


def detect_devices(requested: str = "auto") -> Devices:
    """The devices of ``requested`` ("auto", "tpu", "gpu", "cpu") over every process; the precision to train in is
    the run's plan's to decide (:meth:`Devices.found`)."""
    kind = jax.default_backend() if requested == "auto" else requested
    try:
        devices = jax.devices(backend=kind)  # every process's: the mesh spans them all
    except RuntimeError:
        raise UserInputError(f"accelerator={requested}: JAX sees no {kind.upper()} here (its devices: "
                             f"{jax.devices()}). On a TPU VM install the TPU build: pip install 'jax[tpu]'; on a GPU: "
                             "pip install 'jax[cuda12]'. Or use --accelerator auto.") from None
    return Devices(kind, list(devices))
