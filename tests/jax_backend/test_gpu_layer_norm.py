"""The GPU's LayerNorm (:mod:`tpu_pretrain.jax_backend.gpu_layer_norm`), its two Triton kernels run by Pallas's
interpreter on the CPU: a plain float32 LayerNorm's rows and gradients; which devices take it; a model whose norms
take it computes what the XLA norm's computes; over two devices, each device's rows and the weights' gradient summed
across them."""

import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

pytest.importorskip("jax")  # in .venv-jax only (tests/jax_backend/conftest.py)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from fault_injection import ENV, QUICK_XLA  # noqa: E402

from tpu_pretrain.errors import UserInputError  # noqa: E402
from tpu_pretrain.jax_backend import gpu_layer_norm  # noqa: E402

pytestmark = pytest.mark.skipif(not gpu_layer_norm._KERNELS_AVAILABLE, reason="this JAX has no Pallas Triton backend")


def plain(x, gamma, beta):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    variance = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(variance + 1e-12) * gamma + beta).astype(x.dtype)


def values_and_gradients(norm, x, gamma, beta):
    weights = jnp.cos(jnp.arange(x.shape[-1], dtype=jnp.float32))

    def loss(x, gamma, beta):
        out = norm(x, gamma, beta)
        return jnp.sum(out.astype(jnp.float32) * weights), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, gamma, beta)
    return (out, *grads)


@pytest.mark.parametrize(("dtype", "rows"), [("float32", 7), ("bfloat16", 7), ("float32", 25)])
def test_the_kernels_are_a_layernorm_and_its_gradient(dtype, rows):
    """Rows whose count is not a multiple of the rows per tile nor of a backward program's (three programs for 75
    rows, the last one's last tile empty) and whose width is not a power of two (the masked blocks), with a mean far
    from zero: the output and the input's, scale's and offset's gradients of a float32 LayerNorm, to float32's
    rounding (bfloat16: a step)."""
    x = (jax.random.normal(jax.random.PRNGKey(0), (3, rows, 96)) * 3 + 5).astype(dtype)
    per_program = gpu_layer_norm.ROWS * gpu_layer_norm.BACKWARD_TILES
    assert (3 * rows) % gpu_layer_norm.ROWS and (3 * rows) % per_program and 96 & 95  # 96 columns of a 128 block
    gamma, beta = (jax.random.normal(jax.random.PRNGKey(i), (96,)) for i in (1, 2))
    got = values_and_gradients(lambda *a: gpu_layer_norm.layer_norm(*a, 1e-12), x, gamma, beta)
    want = values_and_gradients(plain, x, gamma, beta)
    assert got[0].dtype == x.dtype and got[0].shape == x.shape
    step = 1e-6 if dtype == "float32" else 8e-3  # relative: float32's rounding, or one bfloat16 step
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        scale = float(jnp.max(jnp.abs(w.astype(jnp.float32))))
        assert float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))) <= step * scale


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_bias_the_kernels_add_first_and_its_gradient_summed_in_their_pass(dtype):
    """``layer_norm(x, ..., bias=b)`` is the norm of ``x + b`` (added in float32); the bias's gradient, the input's
    summed over the rows (per program in the backward kernel, then by XLA), to float32's rounding (bfloat16: a
    step of the largest)."""
    x = (jax.random.normal(jax.random.PRNGKey(0), (3, 25, 96)) * 3 + 5).astype(dtype)
    gamma, beta, bias = (jax.random.normal(jax.random.PRNGKey(i), (96,)) for i in (1, 2, 4))
    weights = jnp.cos(jnp.arange(96, dtype=jnp.float32))

    def grads(norm):
        def loss(x, gamma, beta, bias):
            return jnp.sum(norm(x, gamma, beta, bias).astype(jnp.float32) * weights)
        return jax.grad(loss, argnums=(0, 1, 2, 3))(x, gamma, beta, bias)

    got = grads(lambda x, g, b, c: gpu_layer_norm.layer_norm(x, g, b, 1e-12, None, c))
    want = grads(lambda x, g, b, c: plain(x.astype(jnp.float32) + c, g, b).astype(x.dtype))
    step = 1e-6 if dtype == "float32" else 8e-3
    for g, w in zip(got, want, strict=True):
        scale = float(jnp.max(jnp.abs(w.astype(jnp.float32))))
        assert float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))) <= step * scale
    assert float(jnp.max(jnp.abs(got[3]))) > 0


def test_every_tile_shape_the_gpu_probe_may_choose_computes_the_same_norm(monkeypatch):
    """``gpu_session.sh probe`` times the norm at ``bench_kernels_gpu.NORM_TILES`` and runs the step at the fastest
    (``bench_step_variants``' ``norm_tiles``): each shape must be the same LayerNorm, its tiles and programs cut
    short at 75 rows (three rows more than a multiple of 8), float32's rounding."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from bench_kernels_gpu import NORM_TILES

    x = jax.random.normal(jax.random.PRNGKey(0), (3, 25, 96)) * 3 + 5
    gamma, beta = (jax.random.normal(jax.random.PRNGKey(i), (96,)) for i in (1, 2))
    want = values_and_gradients(plain, x, gamma, beta)
    for rows, tiles, warps in NORM_TILES[1:]:  # the first is the package's
        monkeypatch.setattr(gpu_layer_norm, "ROWS", rows)
        monkeypatch.setattr(gpu_layer_norm, "BACKWARD_TILES", tiles)
        monkeypatch.setattr(gpu_layer_norm, "WARPS", warps)
        got = values_and_gradients(lambda *a: gpu_layer_norm.layer_norm(*a, 1e-12), x, gamma, beta)
        for g, w in zip(got, want, strict=True):
            scale = float(jnp.max(jnp.abs(w)))
            assert float(jnp.max(jnp.abs(g - w))) <= 1e-6 * scale, (rows, tiles, warps)


def described_gpu(capability: str):
    device = types.SimpleNamespace(platform="gpu", compute_capability=capability, device_kind="a GPU")
    return types.SimpleNamespace(devices=np.array([device]))


def test_auto_takes_the_kernels_on_an_ampere_or_newer_gpu_only(monkeypatch):
    """Triton needs compute capability 8.0 (the free T4 has 7.5); a CPU or TPU keeps XLA's norm; the setting
    overrides either way, and a path that is not one is refused with the variable's name."""
    monkeypatch.delenv("TPU_PRETRAIN_LAYERNORM", raising=False)
    assert gpu_layer_norm.applies(described_gpu("9.0")) and gpu_layer_norm.applies(described_gpu("8.0"))
    assert not gpu_layer_norm.applies(described_gpu("7.5"))
    assert not gpu_layer_norm.applies()  # this process's device: the CPU
    assert not gpu_layer_norm.applies(described_gpu("9.0"), "xla")
    assert gpu_layer_norm.applies(None, "pallas")
    monkeypatch.setenv("TPU_PRETRAIN_LAYERNORM", "xla")
    assert not gpu_layer_norm.applies(described_gpu("9.0"))
    monkeypatch.setenv("TPU_PRETRAIN_LAYERNORM", "triton")
    with pytest.raises(UserInputError, match="TPU_PRETRAIN_LAYERNORM"):
        gpu_layer_norm.applies()


def test_a_model_whose_norms_take_the_kernels_computes_what_xla_s_norm_computes(monkeypatch):
    """BERT (post-LN: the embeddings', the blocks' and the MLM head's norms) with every norm the kernels' (the blocks'
    adding the dense layers' biases before them) against the same weights with XLA's: the logits and every weight's
    gradient, float32 to its rounding."""
    from tpu_pretrain.jax_backend.model import build_model
    from tpu_pretrain.models.bert_config import bert_config_for_size

    config = bert_config_for_size("L2-H128", 120)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = build_model(config, 16, 3, with_nsp=False, dtype="float32")
    ids = jax.random.randint(jax.random.PRNGKey(3), (2, 16), 1, 120)
    inputs = [ids, jnp.zeros_like(ids), jnp.array([[1, 5, 9], [0, 2, 15]])]
    weights = [v.value for v in model.trainable_variables]

    norm, calls = gpu_layer_norm.layer_norm, []
    monkeypatch.setattr(gpu_layer_norm, "layer_norm", lambda *a: (calls.append(a[5:] != (None,)), norm(*a))[1])

    def run(path):
        monkeypatch.setenv("TPU_PRETRAIN_LAYERNORM", path)
        calls.clear()

        def loss(w):
            logits = model.stateless_call(w, [], inputs)[0][0]
            return jnp.sum(logits * jnp.sin(jnp.arange(logits.size).reshape(logits.shape))), logits

        return (*jax.grad(loss, has_aux=True)(weights), len(calls))

    got_grads, got, kernels = run("pallas")
    assert kernels == 6  # the embeddings', two per block, the MLM head's
    assert sum(calls) == 4  # the blocks' norms add the attention-output and output layers' biases
    want_grads, want, kernels = run("xla")
    assert kernels == 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(w))))


def test_over_two_devices_each_runs_its_own_rows_and_the_weights_gradient_is_their_sum():
    """The kernels inside ``shard_map`` on a mesh of two (logical CPU) devices, the rows split between them: the
    output and gradients of the norm on one device, the scale's, offset's and bias's gradients summed over both."""
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        from tpu_pretrain.jax_backend import gpu_layer_norm

        mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
        x = jax.random.normal(jax.random.PRNGKey(0), (4, 10, 48)) * 2 + 1
        gamma, beta, bias = (jax.random.normal(jax.random.PRNGKey(i), (48,)) for i in (1, 2, 3))
        weights = jnp.cos(jnp.arange(48.0))

        def grads(x, mesh):
            def loss(x, gamma, beta, bias):
                return jnp.sum(gpu_layer_norm.layer_norm(x, gamma, beta, 1e-12, mesh, bias) * weights)
            return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(x, gamma, beta, bias)

        split = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
        one, two = grads(x, None), grads(split, mesh)
        assert len(two[1][0].sharding.device_set) == 2  # the input's gradient stays split
        odd = x[:3, :5]  # 15 rows: two devices do not divide them, so XLA gathers them
        for a, b in zip(jax.tree.leaves((one, grads(odd, None))), jax.tree.leaves((two, grads(odd, mesh))),
                        strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        print("same on two devices")
    """)
    env = {**ENV, "XLA_FLAGS": f"--xla_force_host_platform_device_count=2 {QUICK_XLA}",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same on two devices" in done.stdout
