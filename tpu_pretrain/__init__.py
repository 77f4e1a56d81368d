"""tpu_pretrain: pretrain BERT-family masked language models on free TPUs, GPUs or a CPU.

Importing the package sets what TensorFlow reads when it is imported (Keras 2 for bert4keras; the TPU
runtime's variables) and never imports TensorFlow itself, so a notebook kernel on a TPU runtime can use
the TPU environment (:mod:`.tf_backend.setup.tpu_env`) without loading TensorFlow. Whether tf-keras and bert4keras
are installed is checked where the TensorFlow backend is first used (:mod:`.tf_backend.model`), so the data steps
and the JAX backend run without them.

Its subpackages, lowest layer first (docs/layout.md has a line on every module, tests/test_layout.py holds the
layers to it):

- ``storage``: one interface over local folders, Google Drive and ``gs://``, with verified transfers.
- ``models``: what a model is, whatever framework trains it: the families, their shapes, their stored weights.
- ``data``: corpus -> vocab -> pretraining instances -> TFRecord shards (never imports TensorFlow).
- ``core``: the run core: what a training run is, whatever framework trains it (neither TensorFlow nor JAX).
- ``tf_backend``: the TensorFlow backend: bert4keras on tf-keras, tf.data, TPU/Mirrored/MultiWorker strategies.
- ``jax_backend``: the JAX backend (the free TPUs' path): the same models trained with Keras 3 on JAX.
- ``export``: a trained run used: evaluated, fill-mask, exported, probed, its curves drawn.
- ``cli``: the ``tpu-pretrain`` command line, one subcommand per step.
- ``notebook``: what the notebooks call, so that no logic lives in a notebook cell.

Its modules:

- ``errors``: errors a user can fix, printed by the command line without a traceback.
- ``formatting``: how sizes and durations read in every message; the training bar.
- ``runtime``: Colab, Kaggle or elsewhere, and whether the machine is a TPU VM.
- ``release``: this release: its version, repository and install source, stated once.
- ``pinned_sets``: the pinned requirement files (``requirements/*.txt``) named, and their pins read.
- ``child_process``: a command run apart, its output passed on line by line as it comes.
- ``environment``: what the package takes from the process environment, and what it sets there first.
- ``folder_lock``: one process at work in a folder (a run's, a data folder): the lock file and the stale rule.
- ``wire_format``: protobuf varints and fields, TFRecord framing, TensorFlow's masked CRC32C.
- ``settings``: every setting, declared once: its section, type, default, help, steps and what it pins.
- ``config``: the one typed configuration (``Config``), built from keywords, files or flags, checked, saved.
- ``config_checks``: the checks a configuration must pass: values of the right kind, settings that agree.
- ``backend``: which training backend this runtime uses (TensorFlow or JAX), without importing either.
- ``training``: ``train()``: picks the backend, checks what it offers, hands its trainer to the core's loop.
- ``demo``: ``tpu-pretrain demo``: the whole path on the built-in sample corpus.
"""

from .environment import EnvironmentSetupError, configure_keras2, configure_tpu_runtime
from .release import VERSION as __version__

configure_keras2()
configure_tpu_runtime()

__all__ = ["EnvironmentSetupError", "__version__"]
