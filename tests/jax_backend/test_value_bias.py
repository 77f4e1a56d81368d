"""BERT's value bias added after attention on the splash kernel's path (``TransformerBlock.value_bias_moves``): each
row of softmax's probabilities sums to 1, so ``P (V + b) = P V + b``, and the bias moves into the output projection's
as ``b W_o``. The same outputs and the same gradient for every weight as the bias added to the values (the kernel in
Pallas's interpreter), with documents apart and padding; off the kernel's path (XLA's attention, the explicit one
under attention dropout) the bias stays on the values.
"""

import importlib.util
import sys

import numpy as np
import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "jax":
    pytest.skip("Keras already runs on another backend in this process", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
from bert_rows import model_with_biases, outputs_and_gradients  # noqa: E402

from tpu_pretrain.jax_backend.model import TransformerBlock  # noqa: E402


@pytest.mark.parametrize("at_rows", [False, True])
def test_the_value_bias_after_the_kernel_gives_what_it_gives_on_the_values(at_rows, monkeypatch):
    model = model_with_biases("splash", 128)
    after, after_grads = outputs_and_gradients(model, at_rows, 128)
    monkeypatch.setattr(TransformerBlock, "value_bias_moves", False)
    on_values, on_values_grads = outputs_and_gradients(model, at_rows, 128)
    for a, b in zip(after, on_values, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0)
    for variable, a, b in zip(model.trainable_variables, after_grads, on_values_grads, strict=True):
        scale = float(jnp.max(jnp.abs(b)))
        assert float(jnp.max(jnp.abs(a - b))) <= 2e-5 * scale, variable.path
        if variable.path.endswith("value/bias"):
            assert scale > 1e-3, variable.path  # the bias is learnt through its new route


@pytest.mark.parametrize(("path", "dropout", "moved"), [("splash", 0.0, True), ("splash", 0.1, False),
                                                        ("xla", 0.0, False)])
def test_the_value_bias_moves_on_the_kernels_path_only(path, dropout, moved):
    """Where the splash kernel runs, the values are projected without their bias (with a zero value kernel, attention
    gives zeros); under attention dropout (the explicit path: its rows do not sum to 1) and on XLA's path (which
    fuses the bias's gradient) with it (attention gives the bias, scaled by dropout's kept share)."""
    model = model_with_biases(path, 128, dropout)
    block = model.blocks[0]
    block.value.kernel.assign(np.zeros(block.value.kernel.shape, np.float32))
    x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 128, 128)), jnp.float32)
    context, _ = block.context(x, jnp.ones((2, 128), bool), training=True)
    assert (context.ndim == 4) == (path == "splash" and not dropout)  # the kernel's order where it runs
    if moved:
        assert float(jnp.max(jnp.abs(context))) == 0.0
    elif dropout:
        assert float(jnp.min(jnp.abs(context))) > 0.0
    else:
        np.testing.assert_allclose(np.asarray(context), np.broadcast_to(block.value.bias.numpy(), context.shape),
                                   rtol=1e-5)
