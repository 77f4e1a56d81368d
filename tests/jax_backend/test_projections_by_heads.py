"""XLA's attention on a TPU fed by projections in the splash kernel's order (``TransformerBlock.
projects_by_heads_on_tpu``, a candidate off by default until a TPU measures it): the query, key and value projected
as ``[batch, heads, length, head_size]`` and their axes swapped back, so that the TPU compiler writes the keys and
values in the layout its attention products read rather than copying them. The same function: on this CPU, a block
compiled as for a TPU gives the same outputs and every weight the same gradient either way (padding, documents
apart), and the path is taken where it applies only.
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

from tpu_pretrain.jax_backend import model as model_module  # noqa: E402
from tpu_pretrain.jax_backend.model import TransformerBlock  # noqa: E402


@pytest.fixture
def heads_given(monkeypatch):
    """The ``heads`` each call of the projections is given, in order."""
    given = []
    project = model_module.shared_input_projections

    def recording(x, kernels, biases, for_gpu, heads=None):
        given.append(heads)
        return project(x, kernels, biases, for_gpu, heads)

    monkeypatch.setattr(model_module, "shared_input_projections", recording)
    return given


def compiled_as_for_a_tpu(monkeypatch, candidate: bool = True):
    monkeypatch.setattr(model_module, "target_platform", lambda mesh=None: "tpu")
    monkeypatch.setattr(TransformerBlock, "projects_by_heads_on_tpu", candidate)  # the candidate, off by default


@pytest.mark.parametrize("at_rows", [False, True])
def test_xla_attention_by_heads_gives_what_it_gives_from_length_major_projections(at_rows, heads_given, monkeypatch):
    compiled_as_for_a_tpu(monkeypatch)
    model = model_with_biases("xla", 128)
    heads_given.clear()  # building the model called the blocks
    by_heads, by_heads_grads = outputs_and_gradients(model, at_rows, 128)
    # the last block at the loss's rows projects its keys and values alone, length-major (explicit attention)
    assert heads_given == [2, None] if at_rows else heads_given == [2, 2]
    monkeypatch.setattr(TransformerBlock, "projects_by_heads_on_tpu", False)
    heads_given.clear()
    length_major, length_major_grads = outputs_and_gradients(model, at_rows, 128)
    assert heads_given == [None, None]
    for a, b in zip(by_heads, length_major, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0)
    for variable, a, b in zip(model.trainable_variables, by_heads_grads, length_major_grads, strict=True):
        assert float(jnp.max(jnp.abs(a - b))) <= 2e-5 * float(jnp.max(jnp.abs(b))), variable.path


@pytest.mark.parametrize(("path", "dropout", "platform", "heads"), [
    ("xla", 0.0, "tpu", 2), ("xla", 0.1, "tpu", None), ("explicit", 0.0, "tpu", None), ("xla", 0.0, "cpu", None),
    ("xla", 0.0, "tpu off", None)])
def test_the_projections_go_by_heads_for_xlas_attention_on_a_tpu_only(path, dropout, platform, heads, heads_given,
                                                                      monkeypatch):
    """By heads where XLA's attention runs on a TPU with the candidate on; length-major on the explicit path (asked
    for, or attention dropout in training), off a TPU (a GPU's cuDNN, this CPU) and by default. The block's context
    is ``[batch, length, hidden]`` either way."""
    if platform != "cpu":
        compiled_as_for_a_tpu(monkeypatch, candidate=platform == "tpu")
    block = model_with_biases(path, 128, dropout).blocks[0]
    heads_given.clear()  # building the model called the blocks
    x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 128, 128)), jnp.float32)
    context, _ = block.context(x, jnp.ones((2, 128), bool), training=True)
    assert heads_given == [heads]
    assert context.shape == x.shape
