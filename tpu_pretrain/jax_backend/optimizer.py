"""AdamW and LAMB with BERT's schedule and clipping, as pure functions of arrays (for ``jax.jit``).

The same arithmetic as the TensorFlow backend's optimizers (:mod:`..tf_backend.optimization`: tf-keras's
AdamW and our LAMB): the learning rate is the core's schedule at the step before the update; gradients are
clipped to a global norm; AdamW first decays the weights (``w -= w * decay * lr``), then takes the
bias-corrected Adam step; LAMB scales each weight's step by ``||w|| / ||update||``. LayerNorm weights
and biases (every 1-D weight) are neither decayed nor trust-scaled, as in BERT.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ..config import TrainConfig
from ..core import schedules
from ..core.schedules import Schedule


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimiser's settings (static under ``jax.jit``)."""

    optimizer: str
    schedule: Schedule
    weight_decay_rate: float
    beta_1: float
    beta_2: float
    epsilon: float
    clip_norm: float

    @classmethod
    def from_config(cls, t: TrainConfig, schedule: Schedule) -> OptimizerSettings:
        if t.optimizer not in ("adamw", "lamb"):
            raise ValueError(f"optimizer must be adamw or lamb, not {t.optimizer!r}")
        return cls(t.optimizer, schedule, t.weight_decay_rate, t.adam_beta1, t.adam_beta2, t.adam_epsilon,
                   t.clip_norm)


def learning_rate(s: OptimizerSettings, step):
    """The run core's schedule (:func:`..core.schedules.learning_rate`) at ``step``, in ``jax.numpy``."""
    return schedules.learning_rate(s.schedule, jnp.asarray(step, jnp.float32), jnp.where, jnp.clip)


def global_norm(grads) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads))


def clip_by_global_norm(grads, clip_norm: float):
    """``(clipped grads, the norm before clipping)``; ``clip_norm <= 0`` leaves them as they are."""
    norm = global_norm(grads)
    if clip_norm <= 0:
        return grads, norm
    scale = clip_norm / jnp.maximum(norm, clip_norm)
    return [g * scale for g in grads], norm


def decayed(params) -> list[bool]:
    """Which weights are decayed: the matrices, not LayerNorm scales/offsets or biases (1-D)."""
    return [p.ndim > 1 for p in params]


def init_slots(params) -> dict:
    """The first and second moments, zero."""
    return {"m": [jnp.zeros_like(p) for p in params], "v": [jnp.zeros_like(p) for p in params]}


def apply_updates(s: OptimizerSettings, params, grads, slots: dict, step, decay_mask: list[bool]):
    """One optimiser step: ``(new params, new slots)``; ``step`` counts the updates already made."""
    lr = learning_rate(s, step)
    t = jnp.asarray(step, jnp.float32) + 1.0
    b1, b2 = s.beta_1, s.beta_2
    new_params, new_m, new_v = [], [], []
    for p, g, m, v, decay in zip(params, grads, slots["m"], slots["v"], decay_mask, strict=True):
        m = m + (g - m) * (1.0 - b1)
        v = v + (jnp.square(g) - v) * (1.0 - b2)
        if s.optimizer == "adamw":
            if decay and s.weight_decay_rate:
                p = p - p * s.weight_decay_rate * lr
            alpha = lr * jnp.sqrt(1.0 - b2**t) / (1.0 - b1**t)
            p = p - m * alpha / (jnp.sqrt(v) + s.epsilon)
        else:  # LAMB
            update = (m / (1.0 - b1**t)) / (jnp.sqrt(v / (1.0 - b2**t)) + s.epsilon)
            ratio = 1.0
            if decay:
                update = update + s.weight_decay_rate * p
                w_norm, u_norm = jnp.linalg.norm(p), jnp.linalg.norm(update)
                ratio = jnp.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
            p = p - lr * ratio * update
        new_params.append(p)
        new_m.append(m)
        new_v.append(v)
    return new_params, {"m": new_m, "v": new_v}


# Dynamic loss scaling for float16 compute, with tf-keras's LossScaleOptimizer defaults: start at 2**15, halve
# the scale (not below 1) and skip the update when a gradient is not finite, double it after 2000 good steps.
INITIAL_LOSS_SCALE, LOSS_SCALE_GROWTH_STEPS, LOSS_SCALE_FACTOR = 2.0**15, 2000, 2.0


def init_loss_scale(scale: float = INITIAL_LOSS_SCALE) -> dict:
    """The loss scale and the count of finite steps since it last changed."""
    return {"scale": jnp.asarray(scale, jnp.float32), "good_steps": jnp.zeros((), jnp.int32)}


def all_finite(grads) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in grads]))


def update_loss_scale(loss_scale: dict, finite) -> dict:
    """The next loss scale after a step whose gradients were (or were not) ``finite``, as tf-keras does it."""
    scale, good = loss_scale["scale"], loss_scale["good_steps"] + 1
    grown = scale * LOSS_SCALE_FACTOR
    grow = good >= LOSS_SCALE_GROWTH_STEPS
    on_finite = jnp.where(grow & jnp.isfinite(grown), grown, scale)
    return {"scale": jnp.where(finite, on_finite, jnp.maximum(scale / LOSS_SCALE_FACTOR, 1.0)),
            "good_steps": jnp.where(finite & ~grow, good, 0).astype(jnp.int32)}
