"""TensorFlow as this backend loads it: once, before bert4keras, with its C++ start-up noise filtered.

Every module here that needs TensorFlow takes ``tf`` from this one, not from ``import tensorflow``, so that the
first of them to load decides nothing: the filtering (:func:`tpu_pretrain.environment.import_tensorflow`, which
also names the install command where TensorFlow is missing) always comes first. The package's ``__init__`` loads
nothing, so the set-up (:mod:`.setup`) is usable where TensorFlow must not be loaded.
"""

from ..environment import import_tensorflow

tf = import_tensorflow()
