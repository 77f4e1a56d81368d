"""Gradients summed in float32 where the computation is bfloat16: every bias's
(:func:`tpu_pretrain.jax_backend.lean_layers.add_bias`) and the token table's rows
(:func:`tpu_pretrain.jax_backend.lookups.gathered_rows`).

Autodiff sums a broadcast's gradient in the gradient's dtype, and XLA keeps a bfloat16 sum in bfloat16 on a Hopper
GPU (H100, H200: ``add.rn.bf16`` in its PTX) and on this CPU (the running sum rounded after every add: 1.4% RMS error
over 32,768 rows, where ``add_bias`` gives 0.14%, the float32 sum rounded once); a table cast to bfloat16 before its
lookup gets its gradient as a scatter-add into bfloat16, which rounds a row after every update (the commonest tokens'
rows 2-18% off here). What runs here: ``add_bias``'s values and gradients (the float32 sum rounded once, to one
bfloat16 step of float64's), float16 and float32 left to autodiff, the widening it sums by exact for every bfloat16;
``gathered_rows``' values those of the cast table and its gradient float64's scatter to float32's precision on
Zipfian ids; and no model's gradient in mixed bfloat16 (BERT with and without NSP, documents apart or not;
ModernBERT with every bias it can have, its decoder tied or not) holding a sum or a scatter-add of bfloat16 values."""

import numpy as np
import pytest

pytest.importorskip("jax")  # in .venv-jax only (tests/jax_backend/conftest.py)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from bert_rows import batch, loss_of_weights  # noqa: E402
from jaxprs import equations  # noqa: E402

from tpu_pretrain.jax_backend.lean_layers import _bfloat16_widened, add_bias  # noqa: E402
from tpu_pretrain.jax_backend.lookups import gathered_rows  # noqa: E402
from tpu_pretrain.jax_backend.model import build_model  # noqa: E402
from tpu_pretrain.jax_backend.modernbert import build_modernbert  # noqa: E402
from tpu_pretrain.models.bert_config import bert_config_for_size  # noqa: E402
from tpu_pretrain.models.modernbert_config import modernbert_config_for_size  # noqa: E402


@pytest.mark.parametrize("x_shape, bias_shape", [((2, 3, 4, 8), (8,)), ((2, 3, 4, 8), (4, 8)),
                                                 ((2, 3, 4, 8), (3, 1, 8)), ((5, 8), (1, 8)),
                                                 ((32768, 64), (64,))])  # BERT-base's rows at batch 256
def test_in_bfloat16_the_bias_gradient_is_the_float32_sum_rounded_once(x_shape, bias_shape):
    """Values exactly ``x + bias``; ``x``'s gradient the one given; the bias's the float64 sum of it over the axes
    the bias was broadcast along, rounded to bfloat16, to within one of its steps (a float32 sum may round the other
    way at a tie)."""
    rng = np.random.default_rng(0)
    x, bias, grad = (jnp.asarray(rng.normal(size=s) * 1e-2, jnp.bfloat16) for s in (x_shape, bias_shape, x_shape))
    out, vjp = jax.vjp(add_bias, x, bias)
    np.testing.assert_array_equal(out, x + bias)
    x_grad, bias_grad = vjp(grad)
    assert x_grad.dtype == bias_grad.dtype == jnp.bfloat16 and bias_grad.shape == bias_shape
    np.testing.assert_array_equal(x_grad, grad)
    exact = np.asarray(grad, np.float64).sum(axis=tuple(range(len(x_shape) - len(bias_shape))))
    exact = exact.sum(axis=tuple(i for i, n in enumerate(bias_shape) if n == 1), keepdims=True)
    assert np.all(np.abs(np.asarray(bias_grad, np.float64) - exact) <= np.abs(exact) * 2.0 ** -7)


def test_float32_and_float16_are_autodiffs_own_sums():
    """Where XLA adds in float32 anyway: ``x + bias`` as autodiff differentiates it, the same program."""
    for dtype in (jnp.float32, jnp.float16):
        x, bias = jnp.ones((4, 8), dtype), jnp.ones((8,), dtype)
        ours = jax.make_jaxpr(jax.grad(lambda x, b: jnp.sum(add_bias(x, b)), argnums=(0, 1)))(x, bias)
        plain = jax.make_jaxpr(jax.grad(lambda x, b: jnp.sum(x + b), argnums=(0, 1)))(x, bias)
        assert str(ours) == str(plain)


def test_the_widening_is_exact_for_every_bfloat16():
    every = jax.lax.bitcast_convert_type(jnp.arange(2 ** 16, dtype=jnp.uint32).astype(jnp.uint16), jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(_bfloat16_widened(every)), np.asarray(every.astype(jnp.float32)))


def test_a_bias_that_would_broadcast_x_is_refused():
    with pytest.raises(ValueError, match=r"a bias of shape \(2, 8\) would broadcast x of shape \(8,\)"):
        add_bias(jnp.zeros(8), jnp.zeros((2, 8)))


def test_gathered_rows_are_the_cast_tables_with_float32_sums_of_their_gradients():
    """BERT's vocabulary, 16,384 token ids drawn by Zipf's law (the commonest ~1,500 times), updates sharing a
    direction: the rows' gradients to float32's precision of float64's scatter."""
    rng = np.random.default_rng(2)
    vocab, tokens, width = 30522, 16384, 32
    frequency = 1.0 / np.arange(1, vocab + 1)
    ids = jnp.asarray(rng.choice(vocab, size=tokens, p=frequency / frequency.sum()), jnp.int32)
    table = jnp.asarray(rng.normal(size=(vocab, width)), jnp.float32)
    grad = jnp.asarray((rng.normal(size=(tokens, width)) + 0.5) * 1e-3, jnp.bfloat16)
    rows, vjp = jax.vjp(lambda t: gathered_rows(t, ids, jnp.bfloat16), table)
    assert rows.dtype == jnp.bfloat16
    np.testing.assert_array_equal(rows, table.astype(jnp.bfloat16)[ids])
    (table_grad,) = vjp(grad)
    exact = np.zeros((vocab, width))
    np.add.at(exact, np.asarray(ids), np.asarray(grad, np.float64))
    assert table_grad.dtype == jnp.float32
    np.testing.assert_allclose(table_grad, exact, rtol=1e-5, atol=1e-9)
    same = jax.make_jaxpr(lambda t: gathered_rows(t, ids, jnp.float32))(table)
    assert str(same) == str(jax.make_jaxpr(lambda t: jnp.take(t, ids, axis=0))(table))  # no cast: autodiff's own


def bfloat16_sums(jaxpr) -> list[str]:
    """Every ``reduce_sum`` or scatter-add of bfloat16 values in ``jaxpr`` and the jaxprs inside it, as ``name:
    shape``."""
    return [f"{e.source_info.name_stack}: {e.invars[0].aval.str_short()}" for e in equations(jaxpr)
            if e.primitive.name in ("reduce_sum", "scatter-add") and e.invars[0].aval.dtype == jnp.bfloat16]


def gradient_jaxpr(model, ids, segments, positions):
    gradient = jax.grad(loss_of_weights(model, [ids, segments, positions]), has_aux=True)
    return jax.make_jaxpr(gradient)([v.value for v in model.trainable_variables]).jaxpr


@pytest.mark.parametrize("with_nsp, documents", [(True, False), (False, True)])
def test_no_bert_gradient_sums_bfloat16(with_nsp, documents):
    ids, segments, positions = batch()
    model = build_model(bert_config_for_size("L2-H128", 300), ids.shape[1], positions.shape[1],
                        with_nsp=with_nsp, dtype="mixed_bfloat16")
    model.document_separator = 3 if documents else None
    assert bfloat16_sums(gradient_jaxpr(model, ids, segments, positions)) == []


@pytest.mark.parametrize("tied", [True, False])
def test_no_modernbert_gradient_sums_bfloat16(tied):
    ids, segments, positions = batch()
    biases = dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True, decoder_bias=True)
    config = modernbert_config_for_size("L2-H128", 300, 64, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                                        cls_token_id=2, sep_token_id=3, mask_token_id=4, local_attention=16,
                                        tie_word_embeddings=tied, **biases)
    model = build_modernbert(config, ids.shape[1], positions.shape[1], dtype="mixed_bfloat16")
    assert bfloat16_sums(gradient_jaxpr(model, ids, segments, positions)) == []
