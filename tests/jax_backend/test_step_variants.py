"""``benchmarks/bench_step_variants.py``'s variants against the package they change, in the JAX suite (they import
the JAX backend's layers): each XLA option variant restores only its own option."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")  # in .venv-jax only (tests/jax_backend/conftest.py)

import jax  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_step_variants  # noqa: E402


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
