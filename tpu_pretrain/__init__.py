"""tpu_pretrain: pretrain BERT-family masked language models on free TPUs, GPUs or a CPU.

Importing the package selects Keras 2 for TensorFlow (bert4keras needs it) before TensorFlow is
imported, and checks that the pinned bert4keras and a matching tf-keras are installed.
"""

from .environment import EnvironmentSetupError, check_dependencies, configure_keras2
from .release import VERSION as __version__

configure_keras2()
check_dependencies()

__all__ = ["EnvironmentSetupError", "__version__"]
