"""Optimisers for pretraining, as in Google's BERT ``optimization.py``, following the run core's schedule.

Built on tf-keras's current optimizer API (not bert4keras's legacy-API optimizers, which fail under
tf-keras), so gradients are summed over replicas before global-norm clipping and the update runs
under any ``tf.distribute`` strategy. Gradient accumulation lives in the training step (it splits the
batch), so that k micro-batches give exactly the gradient of one batch k times the size.
"""

from __future__ import annotations

import dataclasses
import re

from ..core.schedules import Schedule, learning_rate
from .framework import tf

keras = tf.keras


class PlannedSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The run core's :class:`..core.schedules.Schedule` as a tf-keras schedule (evaluated in the graph).

    ``schedule`` may be replaced before the first step (a resumed run's re-planned schedule); it is read
    when the training step is traced.
    """

    def __init__(self, schedule: Schedule):
        self.schedule = schedule

    def __call__(self, step):
        return learning_rate(self.schedule, tf.cast(step, tf.float32), tf.where, tf.clip_by_value)

    def get_config(self):
        return dataclasses.asdict(self.schedule)


class Lamb(keras.optimizers.Optimizer):
    """LAMB (You et al. 2019): Adam direction plus decoupled decay, scaled per layer by ||w|| / ||update||.

    For large global batches (TPU pods, heavy gradient accumulation). Weight decay and the trust
    ratio skip the variables excluded with ``exclude_from_weight_decay`` (LayerNorm and biases).
    """

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay_rate=0.01,
                 name="Lamb", **kwargs):
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.weight_decay_rate = weight_decay_rate

    def build(self, var_list):
        super().build(var_list)
        if hasattr(self, "_built") and self._built:
            return
        self._built = True
        self._m = [self.add_variable_from_reference(v, "m") for v in var_list]
        self._v = [self.add_variable_from_reference(v, "v") for v in var_list]

    def update_step(self, gradient, variable):
        if isinstance(gradient, tf.IndexedSlices):  # embedding lookups; the trust ratio needs it dense
            gradient = tf.convert_to_tensor(gradient)
        lr = tf.cast(self.learning_rate, variable.dtype)
        step = tf.cast(self.iterations + 1, variable.dtype)
        index = self._index_dict[self._var_key(variable)]
        m, v = self._m[index], self._v[index]
        m.assign(self.beta_1 * m + (1 - self.beta_1) * gradient)
        v.assign(self.beta_2 * v + (1 - self.beta_2) * tf.square(gradient))
        m_hat = m / (1 - tf.pow(tf.cast(self.beta_1, variable.dtype), step))
        v_hat = v / (1 - tf.pow(tf.cast(self.beta_2, variable.dtype), step))
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        if self._use_weight_decay(variable):
            update += self.weight_decay_rate * variable
            w_norm, u_norm = tf.norm(variable), tf.norm(update)
            ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, tf.ones_like(w_norm))
        else:
            ratio = tf.constant(1.0, variable.dtype)
        variable.assign_sub(lr * ratio * update)

    def get_config(self):
        config = super().get_config()
        config.update({"learning_rate": self._serialize_hyperparameter(self._learning_rate),
                       "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                       "weight_decay_rate": self.weight_decay_rate})
        return config


def no_decay_variables(variables) -> list:
    """LayerNorm scales/offsets and biases (every 1-D weight in BERT) are not decayed, as in BERT."""
    return [v for v in variables if len(v.shape) <= 1]


def create_optimizer(*, schedule: Schedule, optimizer: str = "adamw", weight_decay_rate: float = 0.01,
                     beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6, clip_norm: float = 1.0,
                     variables=(), jit_compile: bool = False) -> keras.optimizers.Optimizer:
    """AdamW or LAMB following ``schedule``, with clipping and BERT's decay exclusions; create it in the strategy
    scope."""
    schedule = PlannedSchedule(schedule)
    clip = {"global_clipnorm": clip_norm} if clip_norm > 0 else {}
    if optimizer == "adamw":
        opt = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=weight_decay_rate,
                                     beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                                     jit_compile=jit_compile, **clip)
    elif optimizer == "lamb":
        opt = Lamb(learning_rate=schedule, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                   weight_decay_rate=weight_decay_rate, jit_compile=jit_compile, **clip)
    else:
        raise ValueError(f"optimizer must be adamw or lamb, not {optimizer!r}")
    excluded = no_decay_variables(variables)
    # By identity and by name: under a distribution strategy the update sees per-replica components
    # (``name/replica_1:0``) whose identity differs from the mirrored variable's.
    names = [r"^" + re.escape(v.name.split(":")[0]) + r"(/replica_\d+)?:\d+$" for v in excluded]
    opt.exclude_from_weight_decay(var_list=excluded, var_names=names)
    return opt
