"""The TPUs a run can be planned for: each target's chips, hosts and memory, and the topology JAX compiles it as.

One table for the plan command and its benchmark. A target is named as the clouds sell it (``v5e-8``: a v5e
slice of 8 chips; ``v4-8`` and ``v3-8`` count TensorCores, so a v4-8 is 4 chips), the free ones first: Colab's
v5e-1 and v6e-1, Kaggle's v5e-8. ``topology`` and ``chips_per_host`` are what
``jax.experimental.topologies.get_topology_desc`` takes to describe that slice on a machine without it (a plain
``"v5e:1x1"`` is refused without the host bounds in jax 0.7). Memory is the published HBM per JAX device (a chip,
or a TensorCore of a v2/v3 chip); the compiler's own out-of-memory message states what it can really use.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserInputError

GIB = 1 << 30


@dataclass(frozen=True)
class TpuTarget:
    """One TPU slice: what it is called, how JAX describes it, and how much memory each device has."""

    name: str  # as sold: v5e-8
    topology: str  # get_topology_desc's name: v5e:2x4
    chips_per_host: tuple[int, int, int]  # get_topology_desc's chips_per_host_bounds
    devices: int  # JAX devices (chips; TensorCores on v2/v3)
    hosts: int
    hbm_gib: float  # per device, published
    device_kind: str  # JAX's name for one device, as :mod:`.peaks` knows it
    where: str = ""  # where it is free, for messages

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    def describe(self) -> str:
        hosts = f", {self.hosts} hosts" if self.hosts > 1 else ""
        where = f"; {self.where}" if self.where else ""
        return f"{self.name} ({self.devices} x {self.device_kind}, {self.hbm_gib:g} GiB each{hosts}{where})"


TARGETS = {t.name: t for t in (
    TpuTarget("v5e-1", "v5e:1x1", (1, 1, 1), 1, 1, 16, "TPU v5 lite", "Colab's free TPU"),
    TpuTarget("v5e-8", "v5e:2x4", (2, 4, 1), 8, 1, 16, "TPU v5 lite", "Kaggle's free TPU"),
    TpuTarget("v6e-1", "v6e:1x1", (1, 1, 1), 1, 1, 32, "TPU v6 lite", "a Colab TPU runtime"),
    TpuTarget("v5e-4", "v5e:2x2", (2, 2, 1), 4, 1, 16, "TPU v5 lite"),
    TpuTarget("v6e-8", "v6e:2x4", (2, 4, 1), 8, 1, 32, "TPU v6 lite"),
    TpuTarget("v5p-8", "v5p:2x2x1", (2, 2, 1), 4, 1, 95, "TPU v5"),
    TpuTarget("v3-8", "v3:2x2", (2, 2, 1), 8, 1, 16, "TPU v3"),
    TpuTarget("v2-8", "v2:2x2", (2, 2, 1), 8, 1, 8, "TPU v2"),
    # Pod slices: several hosts, one program each (TPU Research Cloud grants).
    TpuTarget("v5e-16", "v5e:4x4", (2, 2, 1), 16, 4, 16, "TPU v5 lite"),
    TpuTarget("v5e-32", "v5e:4x8", (2, 2, 1), 32, 8, 16, "TPU v5 lite"),
)}
FREE = ("v5e-1", "v5e-8", "v6e-1")


def tpu_target(name: str) -> TpuTarget:
    """The target called ``name``; an unknown name is refused with the list."""
    key = name.strip().lower()
    if key not in TARGETS:
        raise UserInputError(f"--tpu {name}: not a TPU this tool can plan for. Choose one of "
                             f"{', '.join(TARGETS)} (free: {', '.join(FREE)}).")
    return TARGETS[key]


def target_of_accelerator_type(accelerator_type: str) -> str | None:
    """The target a TPU VM's ``TPU_ACCELERATOR_TYPE`` names (``v5litepod-8`` -> ``v5e-8``), if it is one of ours."""
    chip, _, count = (accelerator_type or "").strip().lower().partition("-")
    name = f"{ {'v5litepod': 'v5e', 'v6e': 'v6e', 'v5p': 'v5p', 'v3': 'v3', 'v2': 'v2'}.get(chip, chip)}-{count}"
    return name if name in TARGETS else None

