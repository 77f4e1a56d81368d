"""Training: accelerator, input, model, optimisation, the loop, checkpoints and the run folder.

- ``accelerator``: which device and strategy (TPU VM, GPUs, CPU), precision and XLA.
- ``tpu``: the TensorFlow-on-TPU install, its environment, and the diagnosis of a TPU that fails.
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

from ..environment import import_tensorflow

import_tensorflow()  # first, so that TensorFlow's C++ start-up noise is filtered whichever module comes next
