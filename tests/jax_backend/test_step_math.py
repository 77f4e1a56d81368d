"""The training step's hand-written arithmetic (:mod:`tpu_pretrain.jax_backend.step`) against the plain form it
replaces: the cross-entropy with its one-pass gradient against autodiff of ``log_softmax``, and the global norm that
joins the small gradients into one vector against the norm of each. The backends' parity tests check the whole
step against TensorFlow's; these check the pieces alone, on values a step would not meet (labels at both ends of the
vocabulary, rows of very different scale, gradients on both sides of the size where the norm joins them)."""

import functools

import numpy as np
import pytest

pytest.importorskip("jax")  # in .venv-jax only (tests/jax_backend/conftest.py)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tpu_pretrain.jax_backend import step  # noqa: E402


def _autodiff_cross_entropy(logits, labels):
    log_p = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]


def _loss(logits, labels):
    return step.loss_and_prediction(logits, labels)[0]


def _logits(dtype):
    scale = jnp.geomspace(0.01, 30.0, 6)[:, None, None]  # from nearly uniform to nearly one-hot rows
    logits = scale * jax.random.normal(jax.random.PRNGKey(0), (6, 4, 97))
    labels = jnp.array([0, 96, 5, 50]) * jnp.ones((6, 1), jnp.int32)
    return logits.astype(dtype), labels


@pytest.mark.parametrize("dtype, tolerance", [(jnp.float32, 1e-6), (jnp.bfloat16, 8e-3)])
def test_cross_entropy_values_and_gradients_are_autodiffs(dtype, tolerance):
    logits, labels = _logits(dtype)
    got = jax.jit(_loss)(logits, labels)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, _autodiff_cross_entropy(logits, labels), rtol=1e-6, atol=1e-5)
    weights = jnp.linspace(0.5, 2.0, labels.size).reshape(labels.shape)  # a gradient that differs per row

    def grad(f):
        return jax.jit(jax.grad(lambda x: jnp.sum(f(x, labels) * weights)))(logits)

    got_grad, want_grad = grad(_loss), grad(_autodiff_cross_entropy)
    assert got_grad.dtype == dtype
    np.testing.assert_allclose(got_grad.astype(jnp.float32), want_grad.astype(jnp.float32), rtol=1e-5, atol=tolerance)
    # each row's gradient sums to zero (softmax - one_hot) and is negative at the label only
    np.testing.assert_allclose(jnp.sum(got_grad.astype(jnp.float32), axis=-1), 0.0, atol=tolerance * 10)
    np.testing.assert_array_equal(got_grad < 0, jnp.arange(logits.shape[-1]) == labels[..., None])


def test_the_loss_and_the_prediction_come_from_one_pass_over_the_logits():
    """``loss_and_prediction``: the loss as autodiff's, the prediction as ``argmax`` (the first of tied maxima), for
    rows from nearly uniform to nearly one-hot, logits of +-1e4, and a row of all-equal logits; one reduction over
    the logits in the traced function (where the loss and ``argmax`` apart were three passes)."""
    logits, labels = _logits(jnp.float32)
    logits = logits.at[0, 0].set(0.0).at[1, 1].set(jnp.linspace(-1e4, 1e4, 97)).at[2, 2, 7].set(1e4)
    logits = logits.at[2, 2, 60].set(1e4)  # tied with column 7: the first wins
    loss, prediction = jax.jit(step.loss_and_prediction)(logits, labels)
    np.testing.assert_allclose(loss, _autodiff_cross_entropy(logits, labels), rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(prediction, jnp.argmax(logits, -1))
    assert prediction[0, 0] == 0 and prediction[2, 2] == 7 and np.isfinite(np.asarray(loss)).all()
    summary = jax.make_jaxpr(step.loss_and_prediction)(logits, labels)
    reductions = [e for e in summary.eqns[0].params["call_jaxpr"].eqns if e.primitive.name.startswith("reduce")]
    assert len(reductions) == 1 and len(reductions[0].outvars) == 4


def test_global_norm_joins_small_gradients_and_equals_the_norm_of_all():
    keys = jax.random.split(jax.random.PRNGKey(1), 6)
    sizes = [(3,), (768,), (step.SMALL_GRADIENT - 1,), (step.SMALL_GRADIENT,), (300, 400), (2, 768)]
    grads = [jax.random.normal(k, s) * (i + 1) for i, (k, s) in enumerate(zip(keys, sizes, strict=True))]
    grads[1] = grads[1].astype(jnp.bfloat16)  # a gradient in the compute dtype: summed in float32 all the same
    want = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64))) for g in grads))
    got = jax.jit(step.global_norm)(grads)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(step.global_norm(grads[3:5]), np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64)))
                                                                         for g in grads[3:5])), rtol=1e-6)  # no small
    clipped, norm = step.clip_by_global_norm(grads, 1.0)
    np.testing.assert_allclose(step.global_norm(clipped), 1.0, rtol=1e-5)
    np.testing.assert_allclose(norm, want, rtol=1e-6)


def test_the_large_gradients_of_one_shape_are_summed_in_one_reduction():
    """BERT-base's 72 large gradients have three shapes: on a GPU one variadic reduction each (a kernel with an output
    per gradient), each output the gradient's own sum of squares."""
    shapes = [(300, 400)] * 5 + [(400, 300)] * 3 + [(step.SMALL_GRADIENT,)] * 2
    grads = [jax.random.normal(jax.random.PRNGKey(i), s) * (i + 1) for i, s in enumerate(shapes)]
    grads[6] = grads[6].astype(jnp.bfloat16)
    sums = step.sums_of_squares(grads)
    for g, got in zip(grads, sums, strict=True):  # float32 sums of 120,000 squares, which XLA's CPU adds in order
        np.testing.assert_allclose(got, np.sum(np.square(np.asarray(g, np.float64))), rtol=1e-4)
    norm = jax.make_jaxpr(lambda g: step.global_norm(g, by_shape=True))(grads)
    reductions = [e for e in norm.eqns if e.primitive.name.startswith("reduce")]
    assert len(reductions) == 3 and sorted(len(e.outvars) for e in reductions) == [2, 3, 5]
    np.testing.assert_allclose(step.global_norm(grads, by_shape=True), step.global_norm(grads), rtol=1e-5)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype, tolerance", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_logits_padded_to_the_product_s_width_give_the_same_loss_prediction_and_gradients(with_bias, dtype,
                                                                                           tolerance):
    """A GPU's training step computes the tied MLM logits over the vocabulary padded to a multiple of 64 columns
    (``tied_logits(padded=True)``: no pad of their gradient), the padded columns at the dtype's lowest value: the
    loss, the prediction and the gradients of the rows, the table and the bias are the unpadded ones."""
    from tpu_pretrain.jax_backend.lookups import LOGITS_COLUMNS, tied_logits

    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    vocab = 97  # 31 padded columns
    x = (jax.random.normal(keys[0], (6, 4, 16)) * jnp.geomspace(0.1, 30.0, 6)[:, None, None]).astype(dtype)
    table, bias = jax.random.normal(keys[1], (vocab, 16)) * 0.3, jax.random.normal(keys[2], (vocab,))
    labels = jnp.array([0, 96, 5, 50]) * jnp.ones((6, 1), jnp.int32)
    weights = jnp.linspace(0.5, 2.0, labels.size).reshape(labels.shape)

    def loss(padded, x, table, bias):
        logits = tied_logits(x, table, bias if with_bias else None, padded).astype(jnp.float32)
        value, prediction = step.loss_and_prediction(logits, labels)
        return jnp.sum(value * weights), (prediction, logits.shape[-1])

    def run(padded):
        return jax.jit(jax.value_and_grad(functools.partial(loss, padded), (0, 1, 2), has_aux=True))(x, table, bias)

    (want, (want_prediction, want_width)), want_grads = run(False)
    (got, (got_prediction, got_width)), got_grads = run(True)
    assert (want_width, got_width) == (vocab, 128) and got_width % LOGITS_COLUMNS == 0
    np.testing.assert_allclose(got, want, rtol=tolerance)
    np.testing.assert_array_equal(got_prediction, want_prediction)
    for g, w in zip(got_grads, want_grads, strict=True):  # the bias's is zero without one
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=tolerance,
                                   atol=tolerance * float(jnp.max(jnp.abs(w.astype(jnp.float32)))))


def test_a_gpu_s_training_call_pads_the_mlm_logits_and_nothing_else_does(monkeypatch):
    """The model pads its logits where the step differentiates them, on an Ampere or newer GPU only: a training call
    there gets logits of the padded width whose statistics are the unpadded call's; an inference call (export,
    probes) gets the vocabulary's width; on the CPU, none."""
    from tpu_pretrain.jax_backend import model as bert
    from tpu_pretrain.models.bert_config import BertConfig

    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = bert.build_model(config, 16, 4)
    ids = jax.random.randint(jax.random.PRNGKey(4), (3, 16), 1, 100)
    positions = jnp.array([[1, 5, 9, 15]] * 3)
    inputs = [ids, jnp.zeros_like(ids), positions]
    labels = jnp.array([[3, 99, 0, 42]] * 3)
    assert not bert.pads_logits()
    unpadded = model(inputs, training=True)[0]
    monkeypatch.setattr(bert, "pads_logits", lambda mesh=None: True)  # as on an Ampere or newer GPU
    padded, inference = model(inputs, training=True)[0], model(inputs, training=False)[0]
    assert unpadded.shape[-1] == inference.shape[-1] == 100 and padded.shape[-1] == 128
    np.testing.assert_allclose(padded[..., :100], unpadded, rtol=1e-5, atol=1e-5)
    for got, want in zip(step.loss_and_prediction(padded, labels), step.loss_and_prediction(unpadded, labels),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("by_shape", [False, True])
def test_the_gradients_norm_is_finite_exactly_where_every_gradient_is(by_shape):
    """Loss scaling skips a step whose gradients overflowed by the global norm's finiteness (the norm the clipping
    computes anyway), where a check per gradient was a reduction each: an infinity or a NaN anywhere makes it not
    finite; float16's largest gradients, unscaled and summed over micro-batches in float32, do not."""
    largest = jnp.full((4, 300, 400), 65504.0, jnp.float32)  # float16's largest, four micro-batches' worth
    grads = [largest.sum(0), jnp.full((768,), 65504.0), -largest[0], jnp.ones((3,))]
    assert bool(jnp.isfinite(step.global_norm(grads, by_shape)))
    for bad in (jnp.inf, -jnp.inf, jnp.nan):
        for i, where in ((0, (7, 11)), (1, 5), (3, 2)):  # a large gradient, small ones
            spoilt = list(grads)
            spoilt[i] = spoilt[i].at[where].set(bad)
            assert not bool(jnp.isfinite(step.global_norm(spoilt, by_shape))), (bad, i)
