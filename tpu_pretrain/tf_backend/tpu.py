"""Connecting to the TPU of a TPU VM, and saying exactly why it failed when it does.

The TensorFlow that can do this is the pinned TPU build in its own environment (:mod:`.setup.tpu_env`),
with the PJRT variables that :mod:`tpu_pretrain.environment` sets before TensorFlow is imported. A failure is
explained by :mod:`.setup.tpu_diagnosis`: the cause and the fix, from the installed distributions, the
variables TensorFlow was imported with, the TPU's lock and the error's own text.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..environment import tpu_variables_at_import
from ..errors import UserInputError
from .framework import tf
from .setup.tpu_diagnosis import diagnose, explain


class AcceleratorError(UserInputError):
    """The requested accelerator is not usable; the message says why and what to run."""


@dataclass
class TpuHardware:
    """What the TPU system reported when it was initialised."""

    accelerator_type: str  # e.g. v5litepod-8, from the TPU VM; "TPU" when it does not say
    chips: int
    cores: int

    def describe(self) -> str:
        return (f"{self.accelerator_type}: {self.chips} chip{'s' * (self.chips != 1)}, "
                f"{self.cores} core{'s' * (self.cores != 1)}")


def connect_tpu(tpu_name: str) -> tuple[tf.distribute.Strategy, TpuHardware]:
    """Initialise the TPU system and return its strategy, or raise AcceleratorError with the diagnosis."""
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_name or "local")
        tf.config.experimental_connect_to_cluster(resolver)
        topology = tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except Exception as exc:  # the TPU stack raises many types; the diagnosis names the cause
        findings = diagnose(f"{type(exc).__name__}: {exc}", at_import=tpu_variables_at_import())
        raise AcceleratorError(f"No usable TPU ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})."
                               f"\n{explain(findings)}") from exc
    mesh = list(getattr(topology, "mesh_shape", []) or [])
    cores = strategy.num_replicas_in_sync
    chips = math.prod(mesh[:-1]) if len(mesh) > 1 else cores  # the last axis: cores per chip
    kind = os.environ.get("TPU_ACCELERATOR_TYPE") or "TPU"
    return strategy, TpuHardware(kind, chips, cores)


def no_tpu_error() -> AcceleratorError:
    """accelerator=tpu on a machine that is not a TPU VM."""
    return AcceleratorError("accelerator=tpu but this machine has no TPU.\n" + explain(diagnose()))
