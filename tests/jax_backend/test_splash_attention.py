"""The splash attention kernel (:mod:`tpu_pretrain.jax_backend.splash`), run in Pallas's interpreter on the CPU,
against XLA's attention under the same boolean mask: global and sliding-window attention, two documents and
padding in a row, forward and gradients, float32 and bfloat16, within the tolerances the module states. Small
shapes (one 128-token block, two heads) keep the interpreter to seconds.
"""

import importlib.util
import sys
import types

import numpy as np
import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "jax":
    pytest.skip("Keras already runs on another backend in this process", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tpu_pretrain.jax_backend import splash  # noqa: E402
from tpu_pretrain.jax_backend.attention import masked_attention  # noqa: E402
from tpu_pretrain.jax_backend.documents import document_ids  # noqa: E402

L, H, D, SEP = 128, 2, 32, 3
# (forward, gradients): the tolerances splash.py's docstring states
TOLERANCES = {jnp.float32: (2e-5, 1e-4), jnp.bfloat16: (2e-2, 6e-2)}


def row():
    """One packed row: [CLS] 59 tokens [SEP], 40 tokens [SEP], then padding."""
    ids = np.full((1, L), 0, np.int32)
    ids[0, :101] = np.random.default_rng(1).integers(5, 50, 101)
    ids[0, 0], ids[0, 60], ids[0, 100] = 2, SEP, SEP
    return jnp.asarray(ids)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("window", [None, 16], ids=["global", "window"])
def test_splash_equals_xla_with_documents(dtype, window):
    ids = row()
    attend = ids != 0
    documents = document_ids(ids, attend, SEP)
    rng = np.random.default_rng(0)
    q, k, v, weight = (jnp.asarray(rng.standard_normal((1, L, H, D)), dtype) for _ in range(4))
    real = np.asarray(attend[0])  # padding's own outputs differ by design (a segment of its own) and are never read

    def loss(path):
        def f(q, k, v):
            out = masked_attention(q, k, v, attend, documents, window, path)
            return jnp.sum((out * weight).astype(jnp.float32) * attend[:, :, None, None]), out
        return jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    (_, ours), grads = loss("splash")
    (_, theirs), expected = loss("xla")
    forward, backward = TOLERANCES[dtype]
    np.testing.assert_allclose(np.asarray(ours, np.float32)[0, real], np.asarray(theirs, np.float32)[0, real],
                               atol=forward, rtol=0)
    for name, a, b in zip("qkv", grads, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32)[0, real], np.asarray(b, np.float32)[0, real],
                                   atol=backward, rtol=0, err_msg=f"d{name}")


def test_block_sizes_and_lengths():
    assert [splash.block_size(n) for n in (128, 384, 1024, 8192)] == [128, 128, 512, 512]
    with pytest.raises(ValueError, match="multiple of 128"):
        splash.block_size(100)
    assert not splash.applies(1024)  # this process's backend is a CPU: auto keeps XLA's attention


def test_auto_takes_the_kernel_on_a_tpu_from_256_tokens():
    """Compiled for a TPU, ``auto`` takes the kernel at multiples of 128 from :data:`splash.SHORTEST` (256) up; at 128
    XLA's attention, which the TPU compiler's cost model puts at fewer cycles per step there (splash.py's docstring),
    and at a length the kernel cannot take."""
    tpu = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform="tpu")]))
    assert [n for n in (128, 200, 256, 384, 512, 1024, 8192) if splash.applies(n, tpu)] == [256, 384, 512, 1024, 8192]
