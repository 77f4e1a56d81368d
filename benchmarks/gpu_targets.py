"""A GPU described to XLA, so a step can be compiled for it on a machine without one (no kernel runs).

Not a benchmark itself: ``bench_step_variants.py --compile_for h100`` uses it. JAX's CUDA plugin compiles for a
device description (XLA's ``GpuTargetConfig``: the card's cores, memory, cache, compute capability) given to
``jax.experimental.topologies``, the way ``tpu-pretrain plan`` compiles for a TPU it does not have; the optimised
HLO is the GPU compiler's own (its fusions, cuBLAS and cuDNN calls), what :mod:`hlo_roofline` reads. Two
differences from a compile on the card: nothing is autotuned (XLA's heuristics choose, so GEMMs are left to cuBLAS
with ``--xla_gpu_enable_triton_gemm=false``, as the H100 chose for all but 11 of 204 after autotuning), and the
CUDA version checks are skipped (there is no driver to ask).

Needs the CUDA plugin beside the project's JAX, installed apart from the test environments (3.8 GB):
``.venv/bin/uv pip install --python .venv-jax/bin/python --target .gpu-compile
"jax-cuda13-plugin[with-cuda]==$(.venv-jax/bin/python -c 'import jax; print(jax.__version__)')"``, then
``PYTHONPATH=.gpu-compile``.
"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

# the published figures of each card, in XLA's text format for GpuTargetConfig (what the CUDA plugin reads off a
# present card); compute capability 9.0, cuDNN 9, CUDA 13
_HOPPER = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }} registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
runtime_version {{ major: 13 minor: 0 }}
device_description_str: "{name}"
"""
TARGETS = {
    "h100": _HOPPER.format(name="NVIDIA H100 80GB HBM3", bandwidth=3352320000000, memory=84929347584),
    "h200": _HOPPER.format(name="NVIDIA H200", bandwidth=4800000000000, memory=150754820096),
}
NO_PLUGIN = ("JAX's CUDA plugin is needed to compile for a GPU without one: {error}. Install it beside this JAX, "
             "apart from the test environments: .venv/bin/uv pip install --python .venv-jax/bin/python --target "
             ".gpu-compile \"jax-cuda13-plugin[with-cuda]=={version}\", then PYTHONPATH=.gpu-compile.")


def prepare(target: str) -> None:
    """Set what XLA and the plugin read when JAX starts its backends (call before the first JAX computation)."""
    if target not in TARGETS:
        raise ValueError(f"no GPU described as {target!r}; these are: {', '.join(TARGETS)}")
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"  # the plugin asks the driver for versions otherwise
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_enable_triton_gemm=false".strip()


def described(target: str) -> list:
    """The devices of one ``target`` card as JAX's CUDA plugin describes them (RuntimeError: no plugin here)."""
    import jax
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=TARGETS[target], topology="1x1x1")
    except Exception as exc:  # no plugin: "topology not implemented for cuda"
        raise RuntimeError(NO_PLUGIN.format(error=str(exc).splitlines()[0], version=jax.__version__)) from None
    return list(topology.devices)


@contextlib.contextmanager
def compiling_for(target: str):
    """The package's :class:`Devices` for ``target`` (abstract: only compiled for), with JAX's default backend
    reported as ``gpu`` meanwhile, so the model takes its GPU paths (cuDNN's attention, the float32 lookups)."""
    from tpu_pretrain.jax_backend.devices import Devices

    devices = described(target)
    with mock.patch("jax.default_backend", lambda: "gpu"):
        yield Devices("gpu", devices, "bfloat16", abstract=True)
