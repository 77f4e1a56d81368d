"""``benchmarks/bench_step_variants.py``'s variants against the package they change, in the JAX suite (they import
the JAX backend's layers): each XLA option variant restores only its own option."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")  # in .venv-jax only (tests/jax_backend/conftest.py)

import jax  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_step_variants  # noqa: E402
from bert_rows import SEP, P, T, outputs_and_gradients  # noqa: E402


def test_the_benchmarks_option_variants_each_restore_one_default():
    """``bench_step_variants``' ``dot_merger`` and ``triton_gemm`` each leave out one of the options the package
    compiles a GPU's steps with (``devices.GPU_COMPILER_OPTIONS``; XLA's default again for that one only), and joined,
    both: a variant that dropped every option would measure two changes as one."""
    from tpu_pretrain.jax_backend.devices import Devices

    def options(name):
        with bench_step_variants.variant(name):
            return Devices("gpu", jax.devices()[:1]).jit_options()["compiler_options"]

    merger, triton = "xla_gpu_dot_merger_threshold_mb", "xla_gpu_enable_triton_gemm"
    assert set(options("base")) == {merger, triton}
    assert set(options("dot_merger")) == {triton} and set(options("triton_gemm")) == {merger}
    assert options("dot_merger+triton_gemm") == {} and set(options("base")) == {merger, triton}


@pytest.mark.parametrize("candidate", ["pallas_gelu", "short_attention"])
def test_a_pallas_candidate_gives_the_packages_model(candidate):
    """Each Pallas candidate, run by Pallas's interpreter on the CPU in a BERT with the tanh GELU (at 32 tokens: the
    short attention's loop over two query blocks of 16), on :func:`bert_rows.batch` (padding, two documents a row, kept
    apart): the package's logits and every weight's gradient (float32).
    ``pallas_gelu``: the feed-forward GELU's gradient and its bias's as one kernel; ``short_attention``: attention
    with the query's and value's biases added and their gradients summed inside its kernels."""
    import jax.numpy as jnp
    import numpy as np
    import pallas_gelu
    import pallas_short_attention

    from tpu_pretrain.jax_backend import model as model_module
    from tpu_pretrain.models.bert_config import bert_config_for_size

    config = bert_config_for_size("L2-H128", 300)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    config.hidden_act = "gelu_new"
    bert = model_module.build_model(config, T, P, dtype="float32", attention="xla")
    bert.document_separator = SEP  # documents apart: the short attention takes them as ids
    want, want_grads = outputs_and_gradients(bert)
    block = model_module.TransformerBlock
    method, patched, module, kernel = (
        ("hidden", bench_step_variants.pallas_gelu_hidden, pallas_gelu, "bias_gelu")
        if candidate == "pallas_gelu" else
        ("context", bench_step_variants.short_attention_context, pallas_short_attention, "attention"))
    called, original = [], getattr(module, kernel)

    def counted(*args):
        called.append(1)
        return original(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, kernel, counted)  # the candidate's kernel, counted where the variant calls it
        patch.setattr(block, method, patched(getattr(block, method), interpret=True))
        patch.setattr(pallas_short_attention, "TILES", (16, 4, 8))
        got, got_grads = outputs_and_gradients(bert)
    assert len(called) == 2 - (candidate == "short_attention")  # the last block's attention is at its rows only
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0)
    for variable, a, b in zip(bert.trainable_variables, got_grads, want_grads, strict=True):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * float(jnp.max(jnp.abs(b))), variable.path


def test_the_pallas_gelu_kernel_in_bfloat16():
    """``pallas_gelu.bias_gelu`` in bfloat16 (Pallas's interpreter): the package's input gradient bit for bit, and the
    bias's the float32 sum of it rounded once (autodiff's bfloat16 sum on the CPU was 4 bfloat16 steps off here)."""
    import jax.numpy as jnp
    import numpy as np
    from pallas_gelu import bias_gelu

    from tpu_pretrain.jax_backend.lean_layers import tanh_gelu

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    h = (jax.random.normal(keys[0], (3, 50, 300)) * 3).astype(jnp.bfloat16)
    bias = jax.random.normal(keys[1], (300,)).astype(jnp.bfloat16)
    dy = jax.random.normal(keys[2], (3, 50, 300)).astype(jnp.bfloat16)
    _, pullback = jax.vjp(lambda h, b: bias_gelu(h, b, True), h, bias)
    dh, dbias = pullback(dy)
    _, package = jax.vjp(lambda x: tanh_gelu(x, True), h + bias)
    np.testing.assert_array_equal(np.asarray(dh), np.asarray(package(dy)[0]))
    summed = np.asarray(dh, np.float32).reshape(-1, 300).sum(axis=0)
    np.testing.assert_allclose(np.asarray(dbias, np.float32), summed, rtol=2**-8, atol=0)  # rounded once: half a step


def test_variants_timed_in_turns_survive_one_that_fails(tmp_path, capsys):
    """``timed_in_turns``: two real trainers (L2-H128, batch 4) take turns, three rounds of one call each after the
    untimed round; one whose call fails in its second timed round (as a kernel may on a card) leaves the rounds with
    its error said and its trainer closed, and the other's figures stand: a rate from each of its rounds."""
    import argparse

    from bench_train_jax import SMOKE_STEP, step_config

    args = argparse.Namespace(**{**SMOKE_STEP, "steps_per_execution": 2, "data_dir": None})
    config = step_config(str(tmp_path), args, hidden_dropout_prob=0.0)
    ready = {name: bench_step_variants.built(name, config) for name in ("base", "exact_gelu")}
    failing = ready["exact_gelu"]["trainer"]
    calls, closed, original = [], [], failing.train_steps

    def fails_late(steps):
        calls.append(steps)
        if len(calls) == 3:  # the untimed round's call, round 1's, then round 2's fails
            raise RuntimeError("a kernel the card refuses")
        return original(steps)

    failing.train_steps, close = fails_late, failing.close
    failing.close = lambda: (closed.append(1), close())
    results = bench_step_variants.timed_in_turns(ready, config, steps=6, rounds=3)
    assert list(results) == ["base"] and closed == [1] and calls == [2, 2, 2]
    assert len(results["base"]["rates"]) == 3 and all(rate > 0 for rate in results["base"]["rates"])
    assert "its turn in round 2 failed: RuntimeError: a kernel the card refuses" in capsys.readouterr().out


def test_compiling_without_timing_times_nothing():
    """``--steps 0`` (what ``--compile_for`` estimates are run with): each variant compiled and counted, none built to
    be timed, and no rounds to take (the turns once divided by the count of variants timed)."""
    import subprocess

    script = Path(bench_step_variants.__file__)
    done = subprocess.run([sys.executable, str(script), "--smoke", "--steps", "0", "--variants", "base"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "compiled for cpu, one step" in done.stdout and "sequences/s" not in done.stdout
