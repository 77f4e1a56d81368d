"""tpu_pretrain: pretrain BERT-family masked language models on free TPUs, GPUs or a CPU.

Importing the package sets what TensorFlow reads when it is imported (Keras 2 for bert4keras; the TPU
runtime's variables) and never imports TensorFlow itself, so a notebook kernel on a TPU runtime can use
the TPU environment (:mod:`.tf_backend.setup.tpu_env`) without loading TensorFlow. Whether tf-keras and bert4keras
are installed is checked where the TensorFlow backend is first used (:mod:`.tf_backend.model`), so the data steps
and the JAX backend run without them.
"""

from .environment import EnvironmentSetupError, configure_keras2, configure_tpu_runtime
from .release import VERSION as __version__

configure_keras2()
configure_tpu_runtime()

__all__ = ["EnvironmentSetupError", "__version__"]
