"""The second training backend: the same BERT, data and run folder, trained with Keras 3 on JAX.

For TPU runtimes whose images ship JAX and no usable TensorFlow (Colab's, Kaggle's); it needs neither
TensorFlow nor bert4keras. ``train(backend="jax")`` (or ``--backend jax``) uses it; the training loop,
the run folder, the checkpoints' folder format and mirror are the TensorFlow backend's own.

- ``devices``: the JAX devices, the data-parallel mesh and the precision.
- ``model``: BERT in Keras 3 layers, and its weights by Google's checkpoint names.
- ``optimizer``: AdamW and LAMB with BERT's schedule and clipping, as pure functions of arrays.
- ``input``: the shards read without TensorFlow, in an order that is a pure function of (seed, records consumed).
- ``state``: a checkpoint's ``state.npz`` (weights, optimizer slots, step), read with NumPy alone.
- ``trainer``: model, optimizer and input of one configuration, and its compiled steps.
"""

from __future__ import annotations

import os
import sys


def select_keras_backend() -> None:
    """Make Keras 3 run on JAX; it must be chosen before ``keras`` is first imported."""
    keras = sys.modules.get("keras")
    if keras is not None and keras.backend.backend() != "jax":
        from ..environment import EnvironmentSetupError

        raise EnvironmentSetupError(
            f"Keras was imported with the {keras.backend.backend()} backend before the JAX backend was used (the "
            "TensorFlow backend's bert4keras takes the name keras for tf-keras). Use the JAX backend in a new Python "
            "process, or set KERAS_BACKEND=jax before anything imports keras; restart the notebook kernel.")
    os.environ["KERAS_BACKEND"] = "jax"
