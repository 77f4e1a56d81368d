"""AdamW and LAMB with BERT's schedule and clipping, as pure functions of arrays (for ``jax.jit``).

The same arithmetic as the TensorFlow backend's optimizers (:mod:`..train.optimization`: tf-keras's
AdamW and our LAMB): the learning rate is the schedule at the step before the update; gradients are
clipped to a global norm; AdamW first decays the weights (``w -= w * decay * lr``), then takes the
bias-corrected Adam step; LAMB scales each weight's step by ``||w|| / ||update||``. LayerNorm weights
and biases (every 1-D weight) are neither decayed nor trust-scaled, as in BERT.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ..config import TrainConfig


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimiser's settings (static under ``jax.jit``)."""

    optimizer: str
    learning_rate: float
    num_train_steps: int
    num_warmup_steps: int
    power: float
    end_learning_rate: float
    weight_decay_rate: float
    beta_1: float
    beta_2: float
    epsilon: float
    clip_norm: float

    @classmethod
    def from_config(cls, t: TrainConfig) -> OptimizerSettings:
        if t.optimizer not in ("adamw", "lamb"):
            raise ValueError(f"optimizer must be adamw or lamb, not {t.optimizer!r}")
        return cls(t.optimizer, t.learning_rate, t.num_train_steps, t.num_warmup_steps, t.lr_decay_power,
                   t.end_learning_rate, t.weight_decay_rate, t.adam_beta1, t.adam_beta2, t.adam_epsilon, t.clip_norm)


def learning_rate(s: OptimizerSettings, step):
    """Linear warmup to the peak, then polynomial decay to ``end_learning_rate`` (``WarmupPolynomialDecay``)."""
    step = jnp.asarray(step, jnp.float32)
    decay_steps = float(max(1, s.num_train_steps))
    fraction = jnp.minimum(step, decay_steps) / decay_steps
    decayed = (s.learning_rate - s.end_learning_rate) * (1.0 - fraction) ** s.power + s.end_learning_rate
    if s.num_warmup_steps <= 0:
        return decayed
    warmup = s.learning_rate * step / float(s.num_warmup_steps)
    return jnp.where(step < s.num_warmup_steps, warmup, decayed)


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
