"""Training: accelerator, input, model, optimisation, the loop, checkpoints and the run folder.

- ``accelerator``: which device and strategy (TPU VM, GPUs, CPU), precision and XLA.
- ``tpu``: connecting to the TPU of a TPU VM, with the diagnosis when it fails; ``tpu_probe``: ``tpu-check``.
- ``input``: tf.data from the shards: static shapes, an order that is a pure function of (seed, records
  consumed), dynamic masking.
- ``model``: BERT from bert4keras with the original pretraining heads.
- ``weights``: weights by name: Google checkpoint <-> Hugging Face names, safetensors, init checkpoints.
- ``optimization``: AdamW and LAMB with BERT's schedule.
- ``metrics``: the one definition of the MLM/NSP loss and accuracy statistics.
- ``trainer``: the model, optimizer and input of one configuration, and its compiled steps.
- ``loop``: ``train()``: resume, train to the next boundary, log/evaluate/save, stop in time.
- ``checkpoints``, ``mirror``: atomic, verified checkpoints and their background copy.
- ``session``: the session deadline and stop signals.
- ``run_folder``: the contract of a run folder; ``status``: where a run stands.
"""

from importlib import util

from ..environment import import_tensorflow

# First, so that TensorFlow's C++ start-up noise is filtered whichever module comes next. Where TensorFlow is not
# installed, the JAX backend still uses this package's TensorFlow-free modules (resolve, metrics, checkpoints);
# the TensorFlow backend's modules say what to install (train.model checks the whole stack).
if util.find_spec("tensorflow") is not None:
    import_tensorflow()
