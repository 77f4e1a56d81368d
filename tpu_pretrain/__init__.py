"""tpu_pretrain: pretrain BERT-family masked language models on free TPUs, GPUs or a CPU.

Importing the package selects Keras 2 for TensorFlow (bert4keras needs it) before TensorFlow is
imported. The pinned bert4keras and a matching tf-keras are checked where the TensorFlow backend is
first used (:mod:`tpu_pretrain.train.model`), so the data steps and the JAX backend run without them.
"""

from .environment import EnvironmentSetupError, configure_keras2

configure_keras2()

__version__ = "0.1.0"
__all__ = ["EnvironmentSetupError", "__version__"]
