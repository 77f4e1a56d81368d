"""Optimisers and learning-rate schedule for pretraining, as in Google's BERT ``optimization.py``.

Built on tf-keras's current optimizer API (not bert4keras's legacy-API optimizers, which fail under
tf-keras), so gradients are summed over replicas before global-norm clipping and the update runs
under any ``tf.distribute`` strategy. Gradient accumulation lives in the training step (it splits the
batch), so that k micro-batches give exactly the gradient of one batch k times the size.
"""

from __future__ import annotations

import re

import tensorflow as tf

keras = tf.keras


class WarmupPolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to the peak rate, then polynomial decay (power 1: linear) to ``end_learning_rate``."""

    def __init__(self, learning_rate: float, num_train_steps: int, num_warmup_steps: int,
                 power: float = 1.0, end_learning_rate: float = 0.0):
        self.learning_rate = float(learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = int(num_warmup_steps)
        self.power = float(power)
        self.end_learning_rate = float(end_learning_rate)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        decay_steps = float(max(1, self.num_train_steps))
        fraction = tf.minimum(step, decay_steps) / decay_steps
        decayed = (self.learning_rate - self.end_learning_rate) * (1.0 - fraction) ** self.power
        decayed += self.end_learning_rate
        if self.num_warmup_steps <= 0:
            return decayed
        warmup = self.learning_rate * step / float(self.num_warmup_steps)
        return tf.where(step < self.num_warmup_steps, warmup, decayed)

    def get_config(self):
        return {"learning_rate": self.learning_rate, "num_train_steps": self.num_train_steps,
                "num_warmup_steps": self.num_warmup_steps, "power": self.power,
                "end_learning_rate": self.end_learning_rate}


class WarmupStableDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Warmup-stable-decay: linear warmup to the peak, constant, then a cool-down from ``decay_from`` at
    ``decay_start`` to ``end_learning_rate`` at ``num_train_steps`` (polynomial, power 1: linear).

    The constant phase does not depend on when training ends, so a run can go on for as many sessions
    as the user likes and start the cool-down in the last one (:meth:`resume`). Its checkpoints record
    :meth:`get_config`, so a later session continues the same cool-down, or re-plans it without a jump.
    """

    def __init__(self, learning_rate: float, num_train_steps: int, num_warmup_steps: int, decay_start: int,
                 power: float = 1.0, end_learning_rate: float = 0.0, decay_from: float | None = None):
        self.learning_rate = float(learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = int(num_warmup_steps)
        self.decay_start = int(decay_start)
        self.power = float(power)
        self.end_learning_rate = float(end_learning_rate)
        self.decay_from = self.learning_rate if decay_from is None else float(decay_from)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        span = float(max(1, self.num_train_steps - self.decay_start))
        fraction = tf.clip_by_value((step - self.decay_start) / span, 0.0, 1.0)
        decayed = self.end_learning_rate + (self.decay_from - self.end_learning_rate) * (1.0 - fraction) ** self.power
        rate = tf.where(step < self.decay_start, self.learning_rate, decayed)
        if self.num_warmup_steps <= 0:
            return rate
        return tf.where(step < self.num_warmup_steps, self.learning_rate * step / self.num_warmup_steps, rate)

    def get_config(self):
        return {"learning_rate": self.learning_rate, "num_train_steps": self.num_train_steps,
                "num_warmup_steps": self.num_warmup_steps, "decay_start": self.decay_start, "power": self.power,
                "end_learning_rate": self.end_learning_rate, "decay_from": self.decay_from}

    def resume(self, step: int, recorded: dict | None) -> str | None:
        """Place the cool-down for a run resumed at ``step`` whose checkpoint recorded ``recorded``.

        Before the cool-down: it starts where planned, or now if that point has passed. During it,
        with the same end: it goes on unchanged; with another ``num_train_steps`` or end rate it decays
        on from the rate reached, to the new end. Returns what changed, to be logged, or None.
        """
        planned = self.decay_start
        if recorded is None or "decay_start" not in recorded or step < recorded["decay_start"]:
            self.decay_start, self.decay_from = max(planned, step), self.learning_rate
            if self.decay_start > planned:
                return (f"the planned cool-down start (step {planned}) has passed: the cool-down starts now, at "
                        f"step {step}, and lasts {self.num_train_steps - step} steps")
            return None
        same_end = all(recorded.get(k) == getattr(self, k) for k in ("num_train_steps", "end_learning_rate"))
        if same_end:
            self.decay_start, self.decay_from = recorded["decay_start"], recorded["decay_from"]
            return None
        reached = float(WarmupStableDecay(**recorded)(step))
        self.decay_start, self.decay_from = step, reached
        return (f"the cool-down was re-planned at step {step}: from {reached:.3g} down to "
                f"{self.end_learning_rate:.3g} at step {self.num_train_steps}")

    def describe(self) -> str:
        return (f"warmup {self.num_warmup_steps} steps to {self.learning_rate:.3g}, constant, then a cool-down "
                f"from step {self.decay_start} to {self.num_train_steps} down to {self.end_learning_rate:.3g}")


def cooldown_start(num_train_steps: int, num_cooldown_steps: int, num_warmup_steps: int) -> int:
    """Where the cool-down of a wsd schedule starts: ``num_cooldown_steps`` (0: 20% of the run) before the end."""
    cooldown = num_cooldown_steps or max(1, round(0.2 * num_train_steps))
    return max(num_train_steps - cooldown, num_warmup_steps, 0)


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


def create_optimizer(*, optimizer: str = "adamw", learning_rate: float, num_train_steps: int,
                     num_warmup_steps: int, weight_decay_rate: float = 0.01, beta_1: float = 0.9,
                     beta_2: float = 0.999, epsilon: float = 1e-6, clip_norm: float = 1.0,
                     lr_decay_power: float = 1.0, end_learning_rate: float = 0.0, variables=(),
                     jit_compile: bool = False, lr_schedule: str = "linear",
                     num_cooldown_steps: int = 0) -> keras.optimizers.Optimizer:
    """AdamW or LAMB with BERT's (or the wsd) schedule, clipping and decay exclusions; create it in the strategy
    scope."""
    if lr_schedule == "wsd":
        schedule = WarmupStableDecay(learning_rate, num_train_steps, num_warmup_steps,
                                     cooldown_start(num_train_steps, num_cooldown_steps, num_warmup_steps),
                                     lr_decay_power, end_learning_rate)
    else:
        schedule = WarmupPolynomialDecay(learning_rate, num_train_steps, num_warmup_steps, lr_decay_power,
                                         end_learning_rate)
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
