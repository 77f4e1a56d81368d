"""The TensorFlow backend's checkpoint state: a ``tf.train.Checkpoint`` of model and optimizer, in TensorFlow's
format inside the run's checkpoint folders (:mod:`..core.checkpoints` writes, verifies and prunes those)."""

from __future__ import annotations

from pathlib import Path

from ..core.checkpoints import TF_PREFIX
from .framework import tf


class TensorFlowState:
    """A ``tf.train.Checkpoint`` (model, optimizer) as the TensorFlow backend's
    :class:`..core.checkpoints.CheckpointState`."""

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint

    def write(self, folder: Path) -> None:
        self.checkpoint.write(str(folder / TF_PREFIX))

    def read(self, folder: Path) -> None:
        try:
            self.checkpoint.read(str(folder / TF_PREFIX)).assert_existing_objects_matched()
        except AssertionError as exc:
            raise ValueError(str(exc)) from None

    def estimated_bytes(self) -> int:
        return estimate_bytes(self.checkpoint)


def estimate_bytes(checkpoint) -> int:
    """Bytes the variables of a ``tf.train.Checkpoint`` take on disk, plus room for TensorFlow's index."""
    variables = {id(v): v for v in tf.train.TrackableView(checkpoint).descendants() if isinstance(v, tf.Variable)}
    return sum(v.shape.num_elements() * v.dtype.size for v in variables.values()) + 64 * 1024
