"""TensorFlow as this backend loads it: once, before bert4keras, with its C++ start-up noise filtered.

Every module here that needs TensorFlow takes ``tf`` from this one, not from ``import tensorflow``, so that the
first of them to load decides nothing: the filtering (:func:`tpu_pretrain.environment.import_tensorflow`, which
also names the install command where TensorFlow is missing) always comes first. The package's ``__init__`` loads
nothing, so the set-up (:mod:`.setup`) is usable where TensorFlow must not be loaded.

AutoGraph is told to leave bert4keras as written: it is graph-mode Keras code (no Python control flow on tensors),
and transpiling its layers at every start cost about 2.5 of a small run's 18 s of CPU, and 7 s of its 13 s compile
(measured, issue 43), for the same graph. The rule list is TensorFlow's private one (its own tests prepend to it the
same way); where a TensorFlow lacks it, bert4keras is transpiled as before.
"""

from ..environment import import_tensorflow

tf = import_tensorflow()

UNCONVERTED = "bert4keras"


def _leave_unconverted(module_prefix: str) -> None:
    try:
        from tensorflow.python.autograph.core import config, config_lib
    except ImportError:  # a TensorFlow that moved it: AutoGraph converts everything it used to
        return
    if not any(isinstance(rule, config_lib.DoNotConvert) and rule.matches(module_prefix)
               for rule in config.CONVERSION_RULES):
        config.CONVERSION_RULES = (config_lib.DoNotConvert(module_prefix), *config.CONVERSION_RULES)


_leave_unconverted(UNCONVERTED)
