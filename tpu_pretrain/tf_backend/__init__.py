"""The TensorFlow backend: BERT from bert4keras on tf-keras, tf.data input, TPU/Mirrored/MultiWorker strategies.

It implements the run core's trainer contract (:class:`..core.protocol.Trainer`) in :mod:`.trainer`; the
loop, checkpoints, run folder and schedules are the core's. Never imported by a JAX run.

- ``accelerator``: which device and strategy (TPU VM, GPUs, CPU), precision and XLA; ``cluster``: several
  machines; ``tpu``: connecting to a TPU VM's TPU; ``tpu_probe``: ``tpu-check``.
- ``input``: tf.data from the shards: static shapes, an order that is a pure function of (seed, records
  consumed), dynamic masking.
- ``model``: BERT from bert4keras with the original pretraining heads; ``weights``: its weights by Google name.
- ``optimization``: AdamW and LAMB following the core's schedule; ``stats``: the core's statistics in TensorFlow.
- ``state``: the checkpoint state (a ``tf.train.Checkpoint`` of model and optimizer).
- ``trainer``: the model, optimizer and input of one configuration, and its compiled steps.
"""

from importlib import util

from ..environment import import_tensorflow

# First, so that TensorFlow's C++ start-up noise is filtered whichever module comes next; the modules say what
# to install where TensorFlow is missing (model checks the whole stack).
if util.find_spec("tensorflow") is not None:
    import_tensorflow()
