"""A JAX checkpoint's state file: weights, optimizer slots, step, Keras's RNG state (and the float16 loss scale)
in one ``state.npz``.

The file's layout (arrays by name, laid out as in Google's checkpoints) and its readers belong to
:mod:`..models.run_weights`, so evaluating or exporting a JAX run reads its weights with NumPy alone; this
module writes it and restores the trainer from it. The checkpoint folder around it (atomic, verified,
pruned, mirrored) is :mod:`..core.checkpoints`'s, shared with the TensorFlow backend.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..models.run_weights import PARAMS, STATE_FILE, read_arrays

LOSS_SCALE = "loss_scale"  # float16 compute: loss_scale/scale and loss_scale/good_steps
LOSS_SCALE_ARRAYS = ("scale", "good_steps")

__all__ = ["PARAMS", "JaxState"]  # PARAMS: the trainer names the weights it saves with it


class JaxState:
    """The JAX trainer's state as a :class:`..core.checkpoints.CheckpointState`.

    ``get`` returns the arrays to save by name; ``put`` takes them back. Reading refuses (ValueError) a
    file whose names or shapes differ from the model being trained, except the ``optional`` names, which a
    file may lack or hold beyond them (the loss scale: older checkpoints and other precisions have none);
    an unreadable file raises otherwise.
    """

    def __init__(self, get: Callable[[], dict[str, np.ndarray]], put: Callable[[dict[str, np.ndarray]], None],
                 shapes: Callable[[], dict[str, tuple]], optional: Iterable[str] = ()):
        self.get, self.put, self.shapes, self.optional = get, put, shapes, frozenset(optional)

    def write(self, folder: Path) -> None:
        with open(Path(folder) / STATE_FILE, "wb") as handle:
            np.savez(handle, **self.get())

    def read(self, folder: Path) -> None:
        try:
            arrays = read_arrays(folder)
        except (zipfile.BadZipFile, EOFError) as exc:
            raise OSError(f"{Path(folder) / STATE_FILE} is unreadable: {exc}") from None
        expected = self.shapes()
        missing = sorted(set(expected) - set(arrays) - self.optional)
        extra = sorted(set(arrays) - set(expected) - self.optional)
        wrong = [n for n in expected if n in arrays and tuple(arrays[n].shape) != tuple(expected[n])]
        if missing or extra or wrong:
            raise ValueError(f"missing {missing[:3]}, unexpected {extra[:3]}, other shapes {wrong[:3]}")
        self.put(arrays)

    def estimated_bytes(self) -> int:
        shapes = self.shapes()
        return sum(int(np.prod(shape, dtype=np.int64)) * 4 for shape in shapes.values()) + 64 * 1024
