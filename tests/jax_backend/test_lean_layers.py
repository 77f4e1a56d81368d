"""The layers of :mod:`tpu_pretrain.jax_backend.lean_layers` against what they replace. The exact and tanh GELUs with
their hand-written gradients against JAX's own and float64's: the same values and gradients, and a backward pass that
keeps only the input, where autodiff of ``jax.nn.gelu`` keeps two or three activation-sized tensors. LayerNorm with
one-pass statistics against Keras's: the same outputs and gradients, with and without its offset, in float32 and
bfloat16.

Measured on a CPU (JAX 0.10.2) over [-12, 12]: in float32 the values differ by at most 5.1e-7 (at x = -4.38, where
the ``erf`` form, PyTorch's and bert4keras's, loses digits to ``1 + erf`` near 0 and JAX's ``erfc`` form does not;
no difference a training step can see) and the gradients by 2.4e-7; in bfloat16 the output is the float32 answer
rounded once. LayerNorm, on rows of mean -3 to 3 and spread 0.1 to 10 (a mean up to 30 times the spread): outputs within
1e-5 of Keras's (a few float32 steps of the roughest row), its gradients within 1e-5. The shared-input projections
(BERT's query, key and value) against autodiff of the same products: the same values, the same gradients (float32 to
its rounding; bfloat16 to a step), and a backward pass that adds each input gradient to the running total as the GPU
compiler folds into the GEMMs (``product + total``; autodiff writes ``total + product``, kept for other compilers)."""

import functools
import math
import re
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("jax")  # in .venv-jax only (tests/jax_backend/conftest.py)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jaxprs import equations  # noqa: E402

from tpu_pretrain.jax_backend.lean_layers import (  # noqa: E402
    LayerNorm,
    exact_gelu,
    shared_input_projections,
    tanh_gelu,
)
from tpu_pretrain.jax_backend.model import activation  # noqa: E402

X = jnp.concatenate([jnp.linspace(-12.0, 12.0, 4001), jnp.array([0.0, -0.0, 1e-6, -1e-6, 30.0, -30.0])])


GELUS = [pytest.param("gelu", exact_gelu, False, id="exact"),
         pytest.param("gelu_new", functools.partial(tanh_gelu, for_gpu=False), True, id="tanh")]


def _slope64(x: np.ndarray, approximate: bool) -> np.ndarray:
    """The GELU's derivative in float64, from its formula."""
    if not approximate:
        return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    scale = math.sqrt(2 / math.pi)
    tanh = np.tanh(scale * (x + 0.044715 * x**3))
    return 0.5 * (1 + tanh) + 0.5 * x * (1 - tanh * tanh) * scale * (1 + 3 * 0.044715 * x * x)


@pytest.mark.parametrize("name, gelu, approximate", GELUS)
def test_values_and_gradients_are_the_gelus(name, gelu, approximate):
    assert activation(name) is gelu if name == "gelu" else activation(name).func is tanh_gelu
    want = jax.nn.gelu(X, approximate=approximate)
    np.testing.assert_allclose(gelu(X), want, atol=1e-6, rtol=1e-6)
    slope = jax.vmap(jax.grad(gelu))(X)
    # to float32's rounding (autodiff's tanh form is off by 3.5e-6 where tanh ~ -1: 1 - tanh^2 cancels)
    np.testing.assert_allclose(slope, _slope64(np.asarray(X, np.float64), approximate), atol=3e-7, rtol=1e-6)
    assert float(slope[-2]) == 1.0 and float(slope[-1]) == 0.0  # far from 0: the identity and zero


def test_transformers_names_for_the_tanh_gelu_are_one_function():
    assert activation("gelu_pytorch_tanh").func is activation("gelu_fast").func is tanh_gelu


def test_the_gpus_tanh_gelu_is_jaxs_form_in_the_inputs_dtype():
    """The form XLA's GEMM rewriter takes into cuBLASLt's epilogue (which computes it in float32 from the GEMM's
    accumulator); its gradient is the float32 form's."""
    x = X.astype(jnp.bfloat16)
    np.testing.assert_array_equal(tanh_gelu(x, True), jax.nn.gelu(x, approximate=True))
    np.testing.assert_array_equal(jax.grad(lambda v: jnp.sum(tanh_gelu(v, True).astype(jnp.float32)))(x),
                                  jax.grad(lambda v: jnp.sum(tanh_gelu(v, False).astype(jnp.float32)))(x))


def test_the_tanh_gelus_gradient_takes_one_exponential_and_one_division():
    """Its two sigmoids from one exponential and one division: with two of each (jax.nn.sigmoid twice) the gradient's
    kernel was the GPU's largest that is not a matmul, bound by its arithmetic, not its bytes (an H200's trace)."""
    x = X.astype(jnp.bfloat16)
    for for_gpu in (True, False):
        gradient = jax.grad(lambda v, gpu=for_gpu: jnp.sum(tanh_gelu(v, gpu).astype(jnp.float32)))
        program = str(jax.make_jaxpr(gradient)(x))
        assert len(re.findall(r"= exp\b", program)) == 1 and len(re.findall(r"= div\b", program)) == 1, program
        assert "logistic" not in program


@pytest.mark.parametrize("name, gelu, approximate", GELUS)
def test_bfloat16_in_and_out_is_the_float32_answer_rounded_once(name, gelu, approximate):
    x = X.astype(jnp.bfloat16)
    out = gelu(x)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(out.astype(jnp.float32), jax.nn.gelu(x.astype(jnp.float32), approximate=approximate),
                               atol=2e-6, rtol=4e-3)  # half a bfloat16 step
    grad = jax.grad(lambda v: jnp.sum(gelu(v).astype(jnp.float32)))(x)
    assert grad.dtype == jnp.bfloat16
    want = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=approximate)))(x.astype(jnp.float32))
    np.testing.assert_allclose(grad.astype(jnp.float32), want, atol=4e-3, rtol=8e-3)  # one bfloat16 step


@pytest.mark.parametrize("name, gelu, approximate", GELUS)
def test_away_from_a_gpu_the_gelus_are_computed_in_float32(name, gelu, approximate):
    x = X.astype(jnp.bfloat16)
    np.testing.assert_array_equal(gelu(x), gelu(x.astype(jnp.float32)).astype(jnp.bfloat16))


@pytest.mark.parametrize("name, gelu, approximate", GELUS)
def test_the_backward_pass_keeps_only_the_input(name, gelu, approximate):
    """What lets a GPU's GEMM compute the tanh GELU in its epilogue (keeping the input as its auxiliary output)."""
    x = jnp.ones((4, 3072), jnp.bfloat16)

    def kept(f):
        residuals = jax.eval_shape(lambda v: jax.vjp(f, v)[1], x)
        return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(residuals))

    assert kept(gelu) == x.size * 2
    assert kept(lambda v: jax.nn.gelu(v, approximate=approximate)) >= 2 * x.size * 2  # what it replaces


def _rows(dtype):
    key = jax.random.PRNGKey(3)
    spread = jnp.geomspace(0.1, 10.0, 64)[:, None]
    centre = jnp.linspace(-3.0, 3.0, 64)[:, None]
    return (centre + spread * jax.random.normal(key, (64, 768))).astype(dtype)


@pytest.mark.parametrize("center", [True, False])  # BERT's norms; ModernBERT's, without an offset
def test_layernorm_is_kerass_to_float32_rounding(center):
    import keras  # here: the package's import above chose Keras's backend
    x = _rows(jnp.float32)
    ours, keras_own = LayerNorm(epsilon=1e-12, center=center), keras.layers.LayerNormalization(epsilon=1e-12,
                                                                                                center=center)
    ours.build(x.shape), keras_own.build(x.shape)
    weights = [jax.random.normal(jax.random.PRNGKey(i), v.shape) for i, v in enumerate(ours.trainable_variables)]

    def loss(layer, w, x):
        out, _ = layer.stateless_call(w, [], x)
        return jnp.sum(out * jnp.cos(jnp.arange(768.0))), out

    (_, got), got_grads = jax.value_and_grad(lambda w, x: loss(ours, w, x), argnums=(0, 1), has_aux=True)(weights, x)
    (_, want), want_grads = jax.value_and_grad(lambda w, x: loss(keras_own, w, x), argnums=(0, 1),
                                               has_aux=True)(weights, x)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-4)


def test_layernorm_in_mixed_bfloat16_returns_the_compute_dtype_from_float32_arithmetic():
    import keras
    x = _rows(jnp.bfloat16)
    ours = LayerNorm(epsilon=1e-12, dtype="mixed_bfloat16")
    keras_own = keras.layers.LayerNormalization(epsilon=1e-12, dtype="mixed_bfloat16")
    got, want = ours(x), keras_own(x)
    assert got.dtype == want.dtype == jnp.bfloat16
    np.testing.assert_allclose(got.astype(jnp.float32), want.astype(jnp.float32), atol=0.032, rtol=8e-3)
    other_axis = jax.random.normal(jax.random.PRNGKey(5), (4, 6, 8))  # not the last axis: Keras's own arithmetic
    np.testing.assert_array_equal(LayerNorm(axis=1)(other_axis), keras.layers.LayerNormalization(axis=1)(other_axis))


def _projected(dtype):
    keys = jax.random.split(jax.random.PRNGKey(7), 7)
    x = jax.random.normal(keys[0], (2, 5, 16)).astype(dtype)
    kernels = tuple(jax.random.normal(k, (16, 16)).astype(dtype) / 4 for k in keys[1:4])
    biases = tuple(jax.random.normal(k, (16,)).astype(dtype) for k in keys[4:])
    return x, kernels, biases


def _ours(x, kernels, biases, for_gpu):
    return shared_input_projections(x, kernels, biases, for_gpu)


def _autodiff_projections(x, kernels, biases):
    if biases is None:  # ModernBERT's Wqkv: no biases
        return (*(jnp.matmul(x, k) for k in kernels), x)
    return (*(jnp.matmul(x, k) + (0 if b is None else b) for k, b in zip(kernels, biases, strict=True)), x)


def _gradients(projections, x, kernels, biases):
    """Gradients of a loss that reads every projection and ``x`` itself (the residual BERT adds it to)."""
    def loss(x, kernels, biases):
        *outs, same_x = projections(x, kernels, biases)
        return sum(jnp.sum(o.astype(jnp.float32) ** 2 * jnp.cos(jnp.arange(o.shape[-1]) * (i + 1.0)))
                   for i, o in enumerate((*outs, same_x)))

    return jax.grad(loss, argnums=(0, 1, 2))(x, kernels, biases)


@pytest.mark.parametrize("for_gpu", [True, False])
@pytest.mark.parametrize("with_biases", ["all", "none", "not the key"])  # BERT leaves the key's out
@pytest.mark.parametrize("dtype, tolerance", [(jnp.float32, 1e-5), (jnp.bfloat16, 0.05)])
def test_shared_input_projections_are_autodiffs_products_and_gradients(dtype, tolerance, with_biases, for_gpu):
    x, kernels, biases = _projected(dtype)
    biases = {"all": biases, "none": None, "not the key": (biases[0], None, biases[2])}[with_biases]
    ours = functools.partial(_ours, for_gpu=for_gpu)
    got, want = ours(x, kernels, biases), _autodiff_projections(x, kernels, biases)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        np.testing.assert_array_equal(g, w)  # the same forward products
    got_grads, want_grads = (_gradients(f, x, kernels, biases)
                             for f in (ours, _autodiff_projections))
    for g, w in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(want_grads), strict=True):
        assert g.dtype == w.dtype == dtype
        np.testing.assert_allclose(g.astype(jnp.float32), w.astype(jnp.float32), rtol=tolerance,
                                   atol=tolerance * float(jnp.max(jnp.abs(w.astype(jnp.float32)))))


def _products_added_second(projections) -> int:
    """In the gradient's jaxpr, the adds whose second operand (only) is an input gradient of the projections (a product
    of an output gradient with a kernel, the shape of ``x``): ``total + product``, of which the GPU compiler's GEMM
    rewriter (jax 0.10.2) folds one fewer into cuBLAS's accumulation than of ``product + total``."""
    x, kernels, biases = _projected(jnp.float32)
    kernels = tuple(k[:, :8] for k in kernels)  # outputs narrower than x: the input gradients are told by shape
    biases = tuple(b[:8] for b in biases)
    jaxpr = jax.make_jaxpr(lambda *a: _gradients(projections, *a))(x, kernels, biases).jaxpr
    products = {str(e.outvars[0]) for e in jaxpr.eqns
                if e.primitive.name == "dot_general" and e.outvars[0].aval.shape == x.shape}
    return sum(1 for e in jaxpr.eqns if e.primitive.name in ("add", "add_any")
               and str(e.invars[1]) in products and str(e.invars[0]) not in products)


def test_shared_input_projections_accumulate_each_input_gradient_onto_the_last():
    assert _products_added_second(_autodiff_projections) == 3  # autodiff's order: one add left a kernel on a GPU
    assert _products_added_second(functools.partial(_ours, for_gpu=True)) == 0  # the order the GPU compiler folds
    assert _products_added_second(functools.partial(_ours, for_gpu=False)) == 3  # autodiff's: the TPU compiler's


def test_a_model_takes_the_forms_of_the_platform_its_mesh_is_on():
    """The platform-specific forms (the token table's: gathered in float32 for a GPU, cast to bfloat16 first
    elsewhere; the tanh GELU's: in bfloat16 for a GPU's GEMM epilogue, float32 elsewhere) follow the platform the
    step is compiled for (``devices.target_platform``): the trainer's mesh's, not the process's backend, so a TPU's
    step planned on a GPU machine is the TPU's; without a mesh, the backend's."""
    from jax.sharding import Mesh

    from tpu_pretrain.jax_backend.model import build_model
    from tpu_pretrain.models.bert_config import bert_config_for_size

    model = build_model(bert_config_for_size("L2-H128", 100, hidden_act="gelu_new"), 16, 4, with_nsp=False,
                        dtype="mixed_bfloat16")
    ids = jnp.tile(jnp.arange(1, 17), (2, 1))
    weights = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]

    def forms():
        """The dtypes of the gathered tables, and of the tanhs."""
        def loss(w):
            outputs = model.stateless_call(w, others, [ids, jnp.zeros_like(ids), jnp.zeros((2, 4), jnp.int32)])[0]
            return sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree_util.tree_leaves(outputs))

        found = list(equations(jax.make_jaxpr(jax.grad(loss))(weights).jaxpr))
        return tuple({str(e.invars[0].aval.dtype) for e in found if e.primitive.name == name}
                     for name in ("gather", "tanh"))

    gpu = ({"float32"}, {"bfloat16"})
    with mock.patch("jax.default_backend", lambda: "gpu"):  # a GPU machine
        assert forms() == gpu  # no mesh: the process's backend
        model.data_mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("data",))  # compiled for the mesh's devices
        assert forms() == ({"bfloat16"}, {"float32"})
    model.data_mesh = None
    assert forms() == ({"bfloat16"}, {"float32"})
