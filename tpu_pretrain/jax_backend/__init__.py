"""The second training backend: the same BERT (and ModernBERT), data and run folder, trained with Keras 3 on JAX.

For TPU runtimes whose images ship JAX and no usable TensorFlow (Colab's, Kaggle's); it needs neither
TensorFlow nor bert4keras. ``train(backend="jax")`` (or ``--backend jax``) uses it. It implements the run core's
trainer contract (:class:`..core.protocol.Trainer`) in :mod:`.trainer`; the training loop, the run folder, the
checkpoints' folder format and their mirror are the core's (:mod:`..core`), shared with the TensorFlow backend.

- ``devices``: the JAX devices, the data-parallel mesh and the precision.
- ``processes``: JAX's multi-process runtime: joining it, and every process stopped when one is lost.
- ``rendezvous``: before JAX's runtime starts, the processes meet at process 0's address, each wait bounded.
- ``families``: the one place that picks BERT or ModernBERT: the model, its weights' names and stored layout.
- ``model``: BERT in Keras 3 layers, and its weights by Google's checkpoint names; ``modernbert``: ModernBERT in
  Keras 3 layers (transformers' ``ModernBertForMaskedLM``), its weights by transformers' names.
- ``lookups``: embeddings and gathers whose gradients a GPU computes fast (a float32 gather, one-hot matmuls).
- ``lean_layers``: the GELUs, LayerNorm and the query/key/value projections in forms whose compiled step moves
  fewer bytes than Keras's.
- ``documents``: documents in packed rows as model math: each token's document and its position within it.
- ``attention``: which attention path a model takes (cuDNN on the GPUs that take it, XLA, splash, explicit), and
  each path.
- ``splash``: attention on a TPU by JAX's splash kernel (global, sliding window, documents as segment ids).
- ``gpu_layer_norm``: LayerNorm on a GPU of compute capability 8.0+ as two Pallas Triton kernels, a pass each way.
- ``reductions``: several arrays of one shape summed in one variadic reduction (on a GPU a kernel, not one each).
- ``step``: the training step as pure functions: the MLM/NSP loss, accumulated gradients, clipping, AdamW and
  LAMB with BERT's schedule, float16's loss scale.
- ``input``: the shards read without TensorFlow, in an order that is a pure function of (seed, records consumed);
  ``prefetch``: batches placed on the devices by a thread while the steps run.
- ``state``: a checkpoint's ``state.npz`` (weights, optimizer slots, step), read with NumPy alone.
- ``trainer``: model, optimizer state and input of one configuration, and its compiled steps.
- ``calls``: a dispatched call of training steps: its statistics left on the devices until the loop reads them.
- ``inference``: the run used for evaluate, probe and export.
- ``accelerator_check``: ``tpu-check --backend jax``, the run's model and batch timed on the chips.
- ``plan``: ``tpu-pretrain plan``, the training step compiled for a TPU that is not here.
- ``plan_report``: what ``plan`` finds (each compile's memory and FLOPs) and prints; claims only of batches compiled.
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
