"""The TensorFlow backend: BERT from bert4keras on tf-keras, tf.data input, TPU/Mirrored/MultiWorker strategies.

It implements the run core's trainer contract (:class:`..core.protocol.Trainer`) in :mod:`.trainer`; the
loop, checkpoints, run folder and schedules are the core's. Never imported by a JAX run, except its set-up
(:mod:`.setup`), which loads no TensorFlow: this package's ``__init__`` loads nothing, and the modules that
train take TensorFlow from :mod:`.framework`.

- ``setup``: what prepares a machine, without TensorFlow: the pinned TPU set, the TPU environment, the
  diagnosis of TPU failures, several machines (``workers``).
- ``framework``: TensorFlow, loaded once with its C++ start-up noise filtered.
- ``accelerator``: which device and strategy (TPU VM, GPUs, CPU), precision and XLA; ``cluster``: several
  machines; ``tpu``: connecting to a TPU VM's TPU; ``tpu_probe``: ``tpu-check``.
- ``input``: tf.data from the shards: static shapes, an order that is a pure function of (seed, records
  consumed), dynamic masking.
- ``model``: BERT from bert4keras with the original pretraining heads; ``weights``: its weights by Google name.
- ``optimization``: AdamW and LAMB following the core's schedule; ``stats``: the core's statistics in TensorFlow.
- ``state``: the checkpoint state (a ``tf.train.Checkpoint`` of model and optimizer).
- ``inference``: the run used for evaluate, probe and export.
- ``trainer``: the model, optimizer and input of one configuration, and its compiled steps.
"""
