"""The JAX training step as pure functions of arrays: loss, gradients, clipping, the optimizer update.

One step (:func:`train_step`): the MLM(+NSP) loss of the *global* batch, its gradients summed over ``k``
micro-batches (:func:`gradients`), clipped to a global norm, then AdamW or LAMB at the run core's learning rate
(:func:`apply_updates`); in float16 the loss is scaled and an overflowing step keeps its weights
(:func:`unless_overflowed`). :class:`.trainer.JaxTrainer` holds the state, places it on the devices and compiles
these with ``jax.jit``; what a step is made of is one frozen :class:`StepSpec`.

The arithmetic is the TensorFlow backend's (:mod:`..tf_backend.optimization`: tf-keras's AdamW and our LAMB),
which the parity tests check to float32 precision. That is why the optimizer is written here and not taken
from optax: optax's Adam adds epsilon to the bias-corrected ``sqrt(v_hat)``, tf-keras's to ``sqrt(v)`` before
the correction (``eps / sqrt(1 - beta_2**t)`` in optax's terms: 32 times larger at the first step), and
``optax.adamw`` in this step fails the parity test: its fourth step's loss is 8.3e-3 from the TensorFlow
backend's (relative 1.4e-3, tolerance 2e-5); as written here the weights differ by at most 1.2e-7.
``optax.lamb`` trust-scales every weight, where BERT's LAMB skips
biases and LayerNorm. (A chain of optax's parts with a per-step epsilon matches, but needs optax's state
rebuilt from the checkpoint's ``m``/``v``: more code than the update below.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ..config import TrainConfig
from ..core import metrics, schedules
from ..core.schedules import Schedule
from .input import BATCH_FEATURES
from .reductions import summed_together
from .state import LOSS_SCALE

MODEL_INPUTS = ("input_ids", "segment_ids", "masked_lm_positions")
COPIES = "copies"  # the state's key, inside a call's loop, for the weights' compute-dtype copies


# -- the loss ----------------------------------------------------------------------------------------------------
_LOWEST = float(jnp.finfo(jnp.float32).min)  # a row summary's start: exp(_LOWEST - x) is 0, never a NaN


def row_summary(logits, labels):
    """``(max, argmax, sum of exp(logit - max), the label's logit)`` of each row, in float32, from one pass over it:
    one variadic reduction whose running sum of exponentials is rescaled as the maximum grows (an online softmax).

    The MLM head's logits (``[predictions, vocabulary]``) were read three times by the loss and accuracy (the maximum
    with its index, the sum of exponentials, the label's logit): 0.25 ms of reductions in BERT-base's step compiled
    for an H200, 0.09 in one."""
    x = logits.astype(jnp.float32)
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    picked = jnp.where(index == labels[..., None], x, 0.0)

    def combine(a, b):
        (top_a, at_a, sum_a, label_a), (top_b, at_b, sum_b, label_b) = a, b
        top = jnp.maximum(top_a, top_b)
        at = jnp.where(top_a > top_b, at_a, jnp.where(top_b > top_a, at_b, jnp.minimum(at_a, at_b)))  # the first
        return top, at, sum_a * jnp.exp(top_a - top) + sum_b * jnp.exp(top_b - top), label_a + label_b

    return jax.lax.reduce((x, index, jnp.ones_like(x), picked), (_LOWEST, jnp.int32(0), 0.0, 0.0), combine,
                          (x.ndim - 1,))


@jax.custom_vjp
def loss_and_prediction(logits, labels):
    """``(-log softmax(logits)[label], argmax)`` per row (:func:`row_summary`: one pass over the logits), the loss in
    float32, whose gradient is one pass too.

    Autodiff of ``log_softmax`` and ``take_along_axis`` makes the MLM head's backward pass a scatter into a zeroed
    ``[predictions, vocabulary]`` tensor and several passes over the logits (about 2 ms of a BERT-base step compiled
    for an H100, batch 256); the gradient here is ``softmax - one_hot`` in one fusion, from the logits and the rows'
    log-sum-exp (the forward keeps them)."""
    return _loss_and_prediction_forward(logits, labels)[0]


def _loss_and_prediction_forward(logits, labels):
    top, prediction, exponentials, picked = row_summary(logits, labels)
    total = top + jnp.log(exponentials)
    return (total - picked, prediction), (logits, labels, total)


def _loss_and_prediction_backward(saved, grads):
    logits, labels, total = saved
    grad = grads[0]  # the prediction's is nothing (an integer)
    probabilities = jnp.exp(logits.astype(jnp.float32) - total[..., None])
    label = jnp.arange(logits.shape[-1]) == labels[..., None]
    return (grad[..., None] * (probabilities - label)).astype(logits.dtype), None


loss_and_prediction.defvjp(_loss_and_prediction_forward, _loss_and_prediction_backward)


class JaxOps:
    """:class:`..core.metrics.ArrayOps` in ``jax.numpy``: the statistics' one formula serves both backends."""

    float32 = staticmethod(lambda x: jnp.asarray(x, jnp.float32))
    loss_and_prediction = staticmethod(loss_and_prediction)
    sum = staticmethod(jnp.sum)

    @staticmethod
    def rows(labels):
        return jnp.float32(labels.shape[0])


def pretraining_stats(outputs, batch: dict, with_nsp: bool) -> dict:
    """Summed MLM/NSP statistics of a batch (:func:`..core.metrics.pretraining_stats`) as JAX arrays."""
    return metrics.pretraining_stats(outputs, batch, with_nsp, JaxOps)


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


@dataclass(frozen=True)
class StepSpec:
    """What a step is made of, constant under ``jax.jit``: the model's pure call
    (Keras's ``stateless_call``), NSP or not, ``accumulation`` micro-batches over ``replicas`` devices,
    the optimizer and which weights it decays."""

    apply: Callable
    with_nsp: bool
    accumulation: int
    replicas: int
    optimizer: OptimizerSettings
    decay_mask: tuple[bool, ...]
    carry_copies: bool = False  # the weights' compute-dtype copies carried through a call's steps (a GPU's)
    platform: str = "cpu"  # compiled for: a GPU's step sums the clipping norm's gradients by shape


def loss(spec: StepSpec, params, keras_state, batch: dict, global_weight, global_examples, scale=None,
         training: bool = True):
    """``(loss, (statistics, new Keras state))`` of one share of the global batch (times ``scale``, if given):
    MLM per masked token and NSP per example *of the global batch*, so shares add up to the global loss."""
    outputs, keras_state = spec.apply(params, keras_state, [batch[k] for k in MODEL_INPUTS], training=training)
    stats = pretraining_stats(outputs, batch, spec.with_nsp)
    value = metrics.global_batch_loss(stats, global_weight, global_examples, spec.with_nsp)
    return (value if scale is None else value * scale), (stats, keras_state)


def read_dtypes(apply, params, keras_state, inputs) -> list[str | None]:
    """For each weight, the dtype the model reads it in where its one read is a cast (Keras's mixed precision: the
    matrices and biases, cast to bfloat16), else None: read as it is (LayerNorm's scales, a GPU's token table, gathered
    in float32) or more than once (the token table on a CPU: the gather and the MLM head's product, whose gradients
    add up in float32, where a copy's would round their sum to bfloat16). From the traced model (shapes only), not
    from Keras's autocast flags: what it reads."""
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (params, keras_state, inputs))
    closed = jax.make_jaxpr(lambda p, k, x: apply(p, k, x, training=True)[0])(*shapes)
    reads: dict[int, list] = {id(v): [] for v in closed.jaxpr.invars[:len(params)]}
    for eqn in closed.jaxpr.eqns:
        for v in eqn.invars:
            if id(v) in reads:
                cast = eqn.primitive.name == "convert_element_type"
                reads[id(v)].append(jnp.dtype(eqn.params["new_dtype"]).name if cast else None)
    for v in closed.jaxpr.outvars:
        reads.get(id(v), []).append(None)
    return [r[0] if len(r) == 1 else None for r in (reads[id(v)] for v in closed.jaxpr.invars[:len(params)])]


def with_copies(spec: StepSpec, state: dict, batch: dict) -> dict:
    """``state`` with :data:`COPIES` where ``spec.carry_copies``: each weight the model reads only in another dtype
    (:func:`read_dtypes`), cast to it, else None. A call's steps then read the copies and the update writes them
    (:func:`train_step`), where each step's forward pass would cast every weight again: on a GPU 162 small kernels
    per BERT-base step, one launch each."""
    if not spec.carry_copies:
        return state
    dtypes = read_dtypes(spec.apply, state["params"], state["keras"], [batch[k] for k in MODEL_INPUTS])
    return {**state, COPIES: [None if d is None else p.astype(d) for p, d in zip(state["params"], dtypes,
                                                                                strict=True)]}


def micro_batches(batch: dict, k: int, replicas: int) -> dict:
    """[B, ...] -> [k, B/k, ...]; micro-batch i takes the i-th slice of every device's share."""
    def split(x):
        x = x.reshape((replicas, k, -1) + x.shape[1:]).swapaxes(0, 1)
        return x.reshape((k, -1) + x.shape[3:])

    return {key: split(batch[key]) for key in BATCH_FEATURES}


def gradients(spec: StepSpec, state: dict, batch: dict):
    """``(summed gradients, summed statistics, new Keras state)`` of one global batch.

    With loss scaling the gradients are those of the scaled loss, unscaled after the sum (as tf-keras's
    LossScaleOptimizer does); an overflow leaves some of them infinite or NaN.
    """
    global_weight = jnp.maximum(jnp.sum(batch["masked_lm_weights"]), 1.0)
    global_examples = float(batch["input_ids"].shape[0])
    scale = state[LOSS_SCALE]["scale"] if LOSS_SCALE in state else None
    grad_fn = jax.value_and_grad(loss, argnums=1, has_aux=True)
    # the copies the call carries where it does: the model's reads of them are casts to their own dtype (none)
    copies = state.get(COPIES) or [None] * len(state["params"])
    weights = [p if c is None else c for p, c in zip(state["params"], copies, strict=True)]

    def micro_step(carry, micro):
        grads, stats, keras_state = carry
        (_, (s, keras_state)), g = grad_fn(spec, weights, keras_state, micro, global_weight, global_examples, scale)
        grads = [a + b for a, b in zip(grads, g, strict=True)]  # float32: a copy's gradient as its cast's was
        return (grads, {key: stats[key] + s[key] for key in metrics.STAT_KEYS}, keras_state), None

    zeros = ([jnp.zeros_like(p) for p in state["params"]], {key: jnp.float32(0.0) for key in metrics.STAT_KEYS},
             state["keras"])
    (grads, stats, keras_state), _ = jax.lax.scan(micro_step, zeros,
                                                  micro_batches(batch, spec.accumulation, spec.replicas))
    if scale is not None:
        inverse = 1.0 / scale
        grads = [g * inverse for g in grads]
    return grads, stats, keras_state


# -- the update ---------------------------------------------------------------------------------------------------
def learning_rate(s: OptimizerSettings, step):
    """The run core's schedule (:func:`..core.schedules.learning_rate`) at ``step``, in ``jax.numpy``."""
    return schedules.learning_rate(s.schedule, jnp.asarray(step, jnp.float32), jnp.where, jnp.clip)


# Gradients smaller than this (biases, LayerNorm scales: 127 of BERT-base's 202) are summed as one vector.
SMALL_GRADIENT = 65536


def global_norm(grads, by_shape: bool = False) -> jax.Array:
    """The gradients' global L2 norm in float32. The small ones are joined into one vector first: one reduction
    kernel on a GPU instead of one each (BERT-base compiled for an H100: 127 kernels fewer, -0.26 ms estimated), their
    bytes negligible; a large one is summed where it is, as joining it would copy it; ``by_shape`` (a GPU's), those
    of one shape together (:func:`sums_of_squares`)."""
    small = [g.astype(jnp.float32).ravel() for g in grads if g.size < SMALL_GRADIENT]
    large = [g for g in grads if g.size >= SMALL_GRADIENT]
    squares = sums_of_squares(large) if by_shape else [jnp.sum(jnp.square(g.astype(jnp.float32))) for g in large]
    if small:
        squares.append(jnp.sum(jnp.square(jnp.concatenate(small))))
    return jnp.sqrt(sum(squares))


def sums_of_squares(arrays) -> list:
    """Each array's sum of squares in float32, those of one shape in one variadic reduction: one kernel on a GPU with
    an output per array, where a sum each was two kernels (BERT-base's 72 large gradients have three shapes). Not on a
    TPU, whose compiler counts 2.6% more bytes accessed per step for it (v5e, libtpu 0.0.23, L4-H512 at batch 32)."""
    by_shape: dict[tuple, list] = {}
    for a in arrays:
        by_shape.setdefault(a.shape, []).append(jnp.square(a.astype(jnp.float32)))
    return [s for shape, group in by_shape.items() for s in summed_together(group, range(len(shape)))]


def clip_by_global_norm(grads, clip_norm: float, by_shape: bool = False):
    """``(clipped grads, the norm before clipping)``; ``clip_norm <= 0`` leaves them as they are."""
    norm = global_norm(grads, by_shape)
    if clip_norm <= 0:
        return grads, norm
    scale = clip_norm / jnp.maximum(norm, clip_norm)
    return [g * scale for g in grads], norm


def decayed(params) -> tuple[bool, ...]:
    """Which weights are decayed (and LAMB trust-scales): the matrices, not LayerNorm scales/offsets or biases."""
    return tuple(p.ndim > 1 for p in params)


def init_slots(params) -> dict:
    """The first and second moments, zero."""
    return {"m": [jnp.zeros_like(p) for p in params], "v": [jnp.zeros_like(p) for p in params]}


def apply_updates(s: OptimizerSettings, params, grads, slots: dict, step, decay_mask):
    """One optimiser step: ``(new params, new slots)``; ``step`` counts the updates already made.

    AdamW first decays the weights (``w -= w * decay * lr``), then takes the bias-corrected Adam step with
    epsilon where tf-keras puts it; LAMB scales each decayed weight's step by ``||w|| / ||update||``.
    """
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


def update_loss_scale(loss_scale: dict, finite) -> dict:
    """The next loss scale after a step whose gradients were (or were not) ``finite``, as tf-keras does it."""
    scale, good = loss_scale["scale"], loss_scale["good_steps"] + 1
    grown = scale * LOSS_SCALE_FACTOR
    grow = good >= LOSS_SCALE_GROWTH_STEPS
    on_finite = jnp.where(grow & jnp.isfinite(grown), grown, scale)
    return {"scale": jnp.where(finite, on_finite, jnp.maximum(scale / LOSS_SCALE_FACTOR, 1.0)),
            "good_steps": jnp.where(finite & ~grow, good, 0).astype(jnp.int32)}


def unless_overflowed(state: dict, new: dict, finite) -> dict:
    """``new`` if the gradients were finite; else ``state``'s weights and moments with the step counted (the
    schedule moves on, as under tf-keras's LossScaleOptimizer). The loss scale follows either way."""
    def keep(after, before):
        return jax.tree.map(lambda a, b: jnp.where(finite, a, b), after, before)

    return {**new, "params": keep(new["params"], state["params"]), "slots": keep(new["slots"], state["slots"]),
            LOSS_SCALE: update_loss_scale(state[LOSS_SCALE], finite)}


# -- the step -------------------------------------------------------------------------------------------------
def train_step(spec: StepSpec, state: dict, batch: dict):
    """``(new state, summed statistics)`` after one optimizer step over one global batch."""
    grads, stats, keras_state = gradients(spec, state, batch)
    clipped, norm = clip_by_global_norm(grads, spec.optimizer.clip_norm, spec.platform == "gpu")
    params, slots = apply_updates(spec.optimizer, state["params"], clipped, state["slots"], state["step"],
                                  spec.decay_mask)
    new = {"params": params, "keras": keras_state, "slots": slots, "step": state["step"] + 1}
    if LOSS_SCALE in state:
        # every gradient is finite exactly where their norm is (float16 gradients' squares cannot overflow its
        # float32 sum): one check, where a reduction per gradient was 254 kernels, 2.2 ms of a T4's step at 64
        new = unless_overflowed(state, new, jnp.isfinite(norm))
    if COPIES in state:  # written beside the weights by the update's kernels
        new[COPIES] = [None if c is None else p.astype(c.dtype) for p, c in zip(new["params"], state[COPIES],
                                                                                strict=True)]
    return new, stats


def train_chunk(spec: StepSpec, state: dict, batches: dict, steps=None):
    """The first ``steps`` of the stacked batches' steps in one call, their statistics summed.

    ``steps`` is an array, not a shape: one compiled call runs any count up to the stack's length, so calls cut
    short by a log, eval or save boundary (or the run's end) need no compile of their own, and no train of
    single-step calls either. None: every step of the stack, a trip count the compiler knows. A GPU's while loop
    with a count it does not know copies its condition to the host and waits for it after every step (XLA's
    ``WhileThunk``): the devices idled 0.48 ms of each 47 ms step on an H100's trace (benchmarks/GPU_NOTES.md).
    """
    def one(i, carry):
        state, sums = carry
        state, stats = train_step(spec, state, jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, 0, False),
                                                            batches))
        return state, {key: sums[key] + jnp.asarray(stats[key], jnp.float32) for key in metrics.STAT_KEYS}

    zeros = {key: jnp.float32(0.0) for key in metrics.STAT_KEYS}
    state = with_copies(spec, state, jax.tree.map(lambda x: x[0], batches))
    state, sums = jax.lax.fori_loop(0, jax.tree.leaves(batches)[0].shape[0] if steps is None else steps, one,
                                    (state, zeros))
    return {key: value for key, value in state.items() if key != COPIES}, sums


def eval_stats(spec: StepSpec, state: dict, batch: dict) -> dict:
    """A held-out batch's summed statistics (no dropout)."""
    _, (stats, _) = loss(spec, state["params"], state["keras"], batch, 1.0, 1.0, training=False)
    return stats
