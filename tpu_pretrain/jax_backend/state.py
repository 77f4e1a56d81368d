"""A JAX checkpoint's state file: weights, optimizer slots, step, Keras's RNG state (and the float16 loss scale)
in one ``state.npz``.

Arrays are stored by name and laid out as in Google's checkpoints: ``params/<Google name>``,
``m/<Google name>`` and ``v/<Google name>`` (the optimizer's moments), ``keras/<variable path>``
(dropout's seed state), ``step``, and with float16 compute ``loss_scale/scale`` and ``loss_scale/good_steps``
(the dynamic loss scale and the finite steps since it last changed). Because the weights carry Google's BERT
checkpoint names, exporting or converting a JAX run needs NumPy alone (:func:`read_weights`), no JAX. The checkpoint
folder around it (atomic, verified, pruned, mirrored) is :mod:`..core.checkpoints`'s, shared with the
TensorFlow backend.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

STATE_FILE = "state.npz"
PARAMS = "params/"
LOSS_SCALE = "loss_scale"
LOSS_SCALE_ARRAYS = ("scale", "good_steps")


def is_jax_checkpoint(folder: str | Path) -> bool:
    return (Path(folder) / STATE_FILE).is_file()


def read_arrays(folder: str | Path) -> dict[str, np.ndarray]:
    with np.load(Path(folder) / STATE_FILE, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def read_weights(folder: str | Path) -> dict[str, np.ndarray]:
    """The model's weights in a JAX checkpoint folder, by Google BERT name, as float32."""
    with np.load(Path(folder) / STATE_FILE, allow_pickle=False) as data:
        return {name[len(PARAMS):]: data[name].astype(np.float32) for name in data.files if name.startswith(PARAMS)}


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
