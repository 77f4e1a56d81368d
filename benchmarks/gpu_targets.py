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

# the published figures of each card, in XLA's text format for GpuTargetConfig (what the CUDA plugin reads off a
# present card); cuDNN 9, CUDA 13
_CARD = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: {shared_per_core} threads_per_core_limit: {threads_per_core} core_count: {cores}
  fpus_per_core: {fpus} block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: {l2} clock_rate_ghz: {clock}
  device_memory_size: {memory} shared_memory_per_block_optin: {optin}
  cuda_compute_capability {{ major: {major} minor: {minor} }} registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
runtime_version {{ major: 13 minor: 0 }}
device_description_str: "{name}"
"""
_HOPPER = dict(major=9, minor=0, cores=132, fpus=128, shared_per_core=233472, optin=232448, threads_per_core=2048,
               l2=52428800, clock=1.98)
TARGETS = {
    "h100": _CARD.format(name="NVIDIA H100 80GB HBM3", bandwidth=3352320000000, memory=84929347584, **_HOPPER),
    "h200": _CARD.format(name="NVIDIA H200", bandwidth=4800000000000, memory=150754820096, **_HOPPER),
    "a100": _CARD.format(name="NVIDIA A100-SXM4-40GB", major=8, minor=0, cores=108, fpus=64, shared_per_core=167936,
                         optin=166912, threads_per_core=2048, l2=41943040, clock=1.41, bandwidth=1555000000000,
                         memory=42298834944),
    "l4": _CARD.format(name="NVIDIA L4", major=8, minor=9, cores=58, fpus=128, shared_per_core=102400, optin=101376,
                       threads_per_core=1536, l2=50331648, clock=2.04, bandwidth=300000000000, memory=23580639232),
    # Colab's and Kaggle's free GPU: no bfloat16, no cuDNN fused attention (compute capability 7.5)
    "t4": _CARD.format(name="Tesla T4", major=7, minor=5, cores=40, fpus=64, shared_per_core=65536, optin=65536,
                       threads_per_core=1024, l2=4194304, clock=1.59, bandwidth=320000000000, memory=15835660288),
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
    """The package's :class:`Devices` for ``target`` (abstract: only compiled for): their mesh is on the GPU, so the
    model takes its GPU forms (``devices.target_platform``: cuDNN's attention, the float32 lookups)."""
    from tpu_pretrain.jax_backend.devices import Devices, compute_at_least

    devices = described(target)
    # bfloat16 where native, else float16 (loss scaled), as auto decides for a T4
    precision = "bfloat16" if compute_at_least(devices[0], 8.0) else "float16"
    yield Devices("gpu", devices, precision, abstract=True)


def lowering_for(devices):
    """While a step compiled for ``devices`` (described) is lowered: the described card as JAX's default device,
    which Pallas's Triton lowering (jax 0.11) asks which GPU it lowers for (the package's LayerNorm kernels)."""
    import jax

    return jax.default_device(devices.devices[0])
