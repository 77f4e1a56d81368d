"""Every benchmark still runs: each ``benchmarks/bench_*.py --smoke`` in its own process, as a user would start it.

``--smoke`` is a seconds-long run of the benchmark's own code path (a tiny model, a few steps, tiny data); its
figures mean nothing, so nothing here checks their values, only that the script ran, said it was a smoke run and
printed figures. The scripts are found by glob: a new benchmark is covered as soon as it exists, and fails here
until it has ``--smoke``. The selected scripts start together, a few at a time (most of a smoke run is one
process importing a framework and building a graph), and each test waits for its own.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from fault_injection import quick_compiles

ROOT = Path(__file__).resolve().parents[1]
# bench_gpu.py's smoke run runs these two with --smoke as its phases and checks their figures: not run twice
RUN_BY_BENCH_GPU = ("bench_train_jax.py", "bench_train_torch_peer.py")
BENCHMARKS = sorted(p for p in (ROOT / "benchmarks").glob("bench_*.py") if p.name not in RUN_BY_BENCH_GPU)
TIMEOUT_SECONDS = 600  # per script: generous, for a loaded machine (a smoke run takes seconds plus its imports)
FIGURE = re.compile(r"\d\.\d|\d\s*%")  # a measured figure: a decimal number or a percentage
JOBS = min(4, max(2, (os.cpu_count() or 1) // 2))  # smoke runs at once


def test_benchmarks_are_found():
    names = {script.name for script in BENCHMARKS}
    assert {"bench_train.py", "bench_storage.py", "bench_gpu.py"} <= names, names
    phases = (ROOT / "benchmarks" / "bench_gpu.py").read_text()
    for name in RUN_BY_BENCH_GPU:  # still there, and still run by bench_gpu.py's smoke run
        assert (ROOT / "benchmarks" / name).is_file() and f'"{name}"' in phases, name


def run_smoke(script: Path, running: set) -> tuple[int | None, str, str, float]:
    """(exit code, stdout, stderr, seconds) of ``script --smoke``; on timeout its whole process group is killed
    and the code is None. The process is in ``running`` while it runs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TF_CPP_MIN_LOG_LEVEL": "2", **quick_compiles(os.environ.get("XLA_FLAGS", ""))}  # figures unread
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(script), "--smoke"], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    running.add(process)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        kill_group(process)
        stdout, stderr = process.communicate()
        return None, stdout, stderr, time.perf_counter() - start
    finally:
        running.discard(process)
    return process.returncode, stdout, stderr, time.perf_counter() - start


def kill_group(process: subprocess.Popen) -> None:
    """Kill the benchmark and whatever it started (trainers, workers, an emulator): its process group."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def smoke_runs(request) -> dict[Path, Future]:
    """Every selected script's smoke run, started at once (JOBS at a time)."""
    selected = [item.callspec.params["script"] for item in request.session.items
                if item.module is request.module and item.originalname == "test_benchmark_smoke_run"]
    running: set[subprocess.Popen] = set()
    pool = ThreadPoolExecutor(JOBS)
    try:
        yield {script: pool.submit(run_smoke, script, running) for script in selected}
    finally:  # interrupted: nothing is left running
        pool.shutdown(wait=False, cancel_futures=True)
        for process in list(running):
            kill_group(process)
        pool.shutdown(wait=True)


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_benchmark_smoke_run(script: Path, smoke_runs):
    code, stdout, stderr, seconds = smoke_runs[script].result()
    if code is None:
        pytest.fail(f"{script.name} --smoke ran past {TIMEOUT_SECONDS} s: a smoke run must take seconds (a tiny "
                    f"model, a few steps, tiny data). Its output so far:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    failed = f"{script.name} --smoke exited with {code} after {seconds:.0f} s"
    if "unrecognized arguments: --smoke" in stderr:
        pytest.fail(f"{script.name} has no --smoke flag: add one (a seconds-long run of the same code path on a tiny "
                    "model and data, saying that its figures are meaningless; benchmarks/support.py's parse_args "
                    "adds it) so that CI proves the benchmark still runs.")
    assert code == 0, f"{failed}:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    assert re.search("smoke", stdout, re.IGNORECASE), (
        f"{script.name} --smoke must say in its output that it ran in smoke mode and its figures are meaningless "
        f"(does it read --smoke at all?):\n{stdout[-3000:]}")
    figures = [line for line in stdout.splitlines() if FIGURE.search(line) and "smoke" not in line.lower()]
    assert figures, f"{script.name} --smoke printed no figure:\n{stdout[-3000:]}"
    if script.name == "bench_gpu.py":
        check_gpu_bench(stdout)
    print(f"{script.name} --smoke: {seconds:.1f} s")


def check_gpu_bench(stdout: str) -> None:
    """bench_gpu.py ran every phase (none failed, none left out for time), printed its table and wrote its JSON."""
    written = re.search(r"^results written to (.+)$", stdout, re.MULTILINE)
    assert written, f"bench_gpu.py --smoke did not say where its JSON went:\n{stdout[-3000:]}"
    results = json.loads(Path(written[1]).read_text())
    assert not [n for n, phase in results["phases"].items() if "error" in phase or "skipped" in phase], (
        f"bench_gpu.py --smoke lost phases:\n{stdout[-3000:]}")
    assert all(row["sequences_per_second"] for row in results["rows"]), results["rows"]
    assert all(ratio["value"] for ratio in results["ratios"].values()), results["ratios"]
    assert all(row["what"][:40] in stdout for row in results["rows"]), f"no table:\n{stdout[-3000:]}"


def test_device_profile_sums_a_gpu_trace_by_kind_and_model_part(tmp_path):
    """``bench_train_jax.py --profile`` on an excerpt of a real trace and optimised HLO (BERT-base, batch 256, five
    steps on an H100, 2026-11-27; six of its kernels): device streams only, per step, each fusion joined to the part
    of the model its ``op_name`` names; library kernels (cuBLAS, cuDNN) by kind. A CPU's trace has no kernels."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import device_profile

    recorded = ROOT / "tests" / "recorded" / "h100_bert_base_step"
    summary = device_profile.breakdown(recorded, recorded, steps=5)
    parts = summary["by_part"]
    assert parts["fwd layer_N/intermediate"] == pytest.approx(4.022, abs=1e-3)  # the GELU, forward
    assert parts["bwd layer_N/intermediate"] == pytest.approx(4.026, abs=1e-3)  # its gradient with the bias's
    assert parts["bwd layer_N/attention_norm"] == pytest.approx(1.371, abs=1e-3)
    assert parts["library gemm"] == pytest.approx(5.004, abs=1e-3)
    assert summary["by_kind"]["attention"] == pytest.approx(2.657, abs=1e-3)  # cuDNN's, though its name has sm90
    assert device_profile.kind_of("layer_norm_backward") == "layer norm"  # the package's Pallas norms, by name
    assert summary["ms_per_step"] == pytest.approx(4.022 + 4.026 + 1.371 + 1.262 + 5.004 + 2.657, abs=5e-3)
    assert summary["top"][0]["kernel"].startswith("nvjet") and summary["top"][0]["per_step"] == 60
    device_profile.keep(recorded, recorded, tmp_path / "kept", summary)
    assert {p.name for p in (tmp_path / "kept").iterdir()} == {"profile.json", "trace.json.gz", "hlo.tar.gz"}
    assert "note" in device_profile.breakdown(tmp_path / "empty", None, steps=1)


def test_device_profile_joins_kernels_inside_the_trainers_nested_loops_to_their_part(tmp_path):
    """An excerpt of an H200's trace of one 20-step call (2026-11-28, two of its kernels) and of that call's
    optimised HLO, whose op names run through the call's loop and the step's (``while/body/eval_jaxpr/while/body/
    eval_jaxpr/...``): the GELU's gradient with its bias's, and the sum of the Pallas norms' partial gradients, each
    joined to its part (they read "bwd while/body" before). A trace whose streams hold no step's kernels (what the
    H200's trace of a call compiled inside it held: copies only) says which tracks it has instead."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import device_profile

    recorded = ROOT / "tests" / "recorded" / "h200_bert_base_step"
    summary = device_profile.breakdown(recorded, recorded, steps=20)
    assert summary["by_part"] == {"bwd layer_N/intermediate": pytest.approx(3.286, abs=1e-3),
                                  "bwd layer_N/output_norm": pytest.approx(0.591, abs=1e-3)}
    assert summary["kernels_per_step"] == 62  # twelve blocks' GELU gradients, fifty norm weights' sums

    copies = {"traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 1, "tid": 14, "name": "thread_name", "args": {"name": "Stream #14(Memset,Compute)"}},
        *({"ph": "X", "pid": 1, "tid": 14, "ts": 10 * i, "dur": 4, "name": "MemcpyD2H"} for i in range(36))]}
    (tmp_path / "only_copies").mkdir()
    with gzip.open(tmp_path / "only_copies" / "x.trace.json.gz", "wt") as f:
        json.dump(copies, f)
    said = device_profile.breakdown(tmp_path / "only_copies", None, steps=5)
    assert said["note"].startswith("36 device kernels on the streams' tracks in 5 steps")
    assert said["tracks"] == [{"process": "/device:GPU:0", "thread": "Stream #14(Memset,Compute)", "events": 36,
                               "ms": 0.144, "names": ["MemcpyD2H"]}]


def test_hlo_roofline_counts_each_kind_of_kernel_a_step_launches():
    """What ``bench_step_variants.py --compile_for h100`` reads off a GPU step's optimised HLO: every kernel in the
    loop's body (times its trip count) and in the command buffer, none for names and views; a fusion that slices a
    buffer reads the slice, one that updates a buffer in place writes the update; FLOPs from the shapes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import hlo_roofline

    module = (ROOT / "tests" / "recorded" / "small_gpu_step.hlo.txt").read_text()
    found = {k.name: k for k in hlo_roofline.kernels(module)}
    assert set(found) == {"loop_slice_fusion", "gemm_fusion_dot.1", "cublas-lt-matmul.1", "loop_update_fusion",
                          "zeros", "next", "attention"}  # the loop counter's add is a (tiny) kernel too
    tile = 256 * 128
    assert found["loop_slice_fusion"].read == 4 * (tile * 4 + 4)  # one f32 slice and the index, four times
    assert found["loop_slice_fusion"].written == 4 * tile * 2
    assert found["loop_slice_fusion"].launches == 4
    assert found["loop_slice_fusion"].part == "fwd embeddings/convert_element_type"
    update = found["loop_update_fusion"]
    assert (update.read, update.written) == (4 * (tile * 2 + 4), 4 * tile * 4)  # the bf16 update, not the buffer
    assert update.part == "bwd layer_N/output"
    assert found["gemm_fusion_dot.1"].flops == 4 * 2 * 256 * 128 * 512
    assert found["cublas-lt-matmul.1"].flops == 4 * 2 * 256 * 512 * 128
    assert found["cublas-lt-matmul.1"].read == 4 * (256 * 512 + 512 * 128) * 2
    assert found["attention"].flops == 4 * 2 * 12 * 128 * 128 * 64 and found["attention"].launches == 1

    card = hlo_roofline.Card("test", bandwidth=1e13, matmul=1e13, launch=1e-6)
    step = hlo_roofline.estimate(list(found.values()), card)
    assert step["kernels"] == 4 * 5 + 2  # five kernels in the loop, four times; two outside
    assert step["ms"] == pytest.approx(step["matmul_ms"] + step["other_ms"])
    gemm = found["gemm_fusion_dot.1"]
    assert step["matmul_ms"] == pytest.approx(1e3 * sum(
        max((k.read + k.written) / 1e13, k.flops / 1e13) + 1e-6 * k.launches for k in found.values() if k.flops))
    assert gemm.flops > gemm.read + gemm.written  # this GEMM is costed by its FLOPs
    assert step["other_by_part"]["bwd layer_N/output"] == pytest.approx(1e3 * (
        (update.read + update.written) / 1e13 + 4e-6))
    with pytest.raises(ValueError, match="no ENTRY"):
        hlo_roofline.kernels("HloModule empty\n")


def test_tpu_cost_model_sums_the_compilers_cycles_over_what_runs():
    """What ``bench_step_variants.py --compile_for v5e-1`` reads off a TPU step's optimised HLO: the cycles the TPU
    compiler's cost model wrote on each instruction that runs, a Pallas kernel's (which carry none) counted apart.
    Recorded: the gradient of a GEMM feeding JAX's splash kernel (2 heads, 256 tokens), compiled for a v5e by jax
    0.12.0.1 / libtpu 0.0.50.1 with no TPU; its splash calls write their metadata over several lines, and the copy of
    the kernel's log-sum-exp after one of them carries its cycles on a continuation line."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import tpu_cost_model

    module = (ROOT / "tests" / "recorded" / "small_tpu_step.hlo.txt").read_text()
    step = tpu_cost_model.step_cycles(module)
    figures = [int(n) for n in re.findall(r'"estimated_cycles":"(\d+)"', module)]  # no fusion's body carries one
    assert step["cycles"] == sum(figures) == 34509
    assert step["unseen_kernels"] == 3  # the kernel's forward, dq and dkv calls
    copy = next(line for line in tpu_cost_model.joined(module).splitlines() if line.startswith("  %copy.5 = "))
    assert "kernel_metadata" in copy and "\n" not in copy  # joined: its metadata spanned lines
    copies = [int(n) for line in tpu_cost_model.joined(module).splitlines() if re.match(r"\s+%copy[.\d]* = ", line)
              for n in re.findall(r'"estimated_cycles":"(\d+)"', line)]
    assert step["by_op"]["copy"] == sum(copies) and len(copies) == 4
    assert sum(step["by_part"].values()) == step["cycles"]
    assert {part.split()[0] for part in step["by_part"]} >= {"fwd", "bwd"}


def test_hlo_roofline_costs_a_real_h100_steps_kernels_near_their_measured_time():
    """Four kernels of BERT-base's step compiled on an H100 (the GELU forward and its gradient, two LayerNorm
    gradients; their fused computations as XLA wrote them) against the same run's trace: their bytes are what their
    shapes hold, and the roofline at the card's calibrated rate is within 15% of their measured time together."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import device_profile
    import hlo_roofline

    recorded = ROOT / "tests" / "recorded" / "h100_bert_base_step"
    found = {k.name: k for k in hlo_roofline.kernels((recorded / "four_kernels.hlo.txt").read_text())}
    activations = 256 * 128 * 3072 * 2  # one bfloat16 [tokens, 3072] tensor
    gelu = found["loop_convert_multiply_fusion.11"]
    assert (gelu.read, gelu.written) == (activations + 3072 * 2, 3 * activations)  # three tensors for its gradient
    assert found["input_add_reduce_fusion"].read == 4 * activations + 3072 * 2  # two of them, y and its gradient
    assert found["fusion.2088"].part == "bwd layer_N/output_norm"

    card = hlo_roofline.CARDS["h100"]
    times, counts = device_profile.device_kernels(recorded)
    traced = {name: name.replace(".", "_") for name in found}  # a fusion's kernel is named after it
    measured = {traced[name]: times[traced[name]] / counts[traced[name]] for name in found}
    estimated = {traced[name]: 1e3 * hlo_roofline.estimate([k], card)["ms"] for name, k in found.items()}  # us
    assert sum(estimated.values()) == pytest.approx(sum(measured.values()), rel=0.15), (estimated, measured)
    for gelu_kernel in ("loop_convert_multiply_fusion_11", "input_add_reduce_fusion"):
        assert estimated[gelu_kernel] == pytest.approx(measured[gelu_kernel], rel=0.15)


def test_gpu_targets_describe_a_card_or_say_how_to_get_the_plugin():
    """``--compile_for h100`` needs JAX's CUDA plugin (not in the test environments): without it the devices are
    refused with the command that installs it; with it, they are the card described (a developer's machine)."""
    pytest.importorskip("jax")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_targets

    try:
        devices = gpu_targets.described("h100")
    except RuntimeError as exc:
        assert "jax-cuda13-plugin[with-cuda]==" in str(exc) and "--target .gpu-compile" in str(exc)
    else:
        assert [d.device_kind for d in devices] == ["NVIDIA H100 80GB HBM3"]
    with pytest.raises(ValueError, match="h100, h200, a100, l4, t4"):
        gpu_targets.prepare("v100")


def test_the_gpu_sessions_script_parses_and_names_variants_the_benchmark_has():
    """``gpu_session.sh`` is run once, on a lent card, with minutes to spare: its shell parses, a wrong option is
    refused before anything runs, and every variant it asks ``bench_step_variants.py`` for is one (a renamed variant
    would cost the card's part its figures)."""
    script = ROOT / "benchmarks" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    for command in ("run", "probe"):
        refused = subprocess.run(["bash", str(script), command, "--bogus"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 2 and "unknown option --bogus" in refused.stderr
    text = script.read_text().replace("\\\n", " ")  # a command continued over lines, joined
    lines = re.findall(r"--variants ([\w+ $]+)$", text, re.MULTILINE)
    # a variant asked for where a condition holds: a shell variable set to its name (norm_tiles=norm_tiles)
    named = {word[1:]: re.findall(rf"\b{word[1:]}=(\w+)", text) for line in lines for word in line.split()
             if word.startswith("$")}
    assert all(named.values()), named
    asked = [change for line in lines for v in line.split() for name in (named[v[1:]] if v[0] == "$" else [v])
             for change in name.split("+")]  # a variant may join changes by +
    changes = re.search(r"^CHANGES = \(([^)]*)\)", (ROOT / "benchmarks" / "bench_step_variants.py").read_text(),
                        re.MULTILINE)[1]
    assert asked and set(asked) <= set(re.findall(r'"(\w+)"', changes)), asked


def test_pallas_attention_variant_is_the_packages_attention_under_padding_and_documents():
    """``bench_step_variants``'s ``pallas_attention`` (JAX's Triton flash attention, padding and documents as segment
    ids), run by Pallas's interpreter on the CPU: the package's XLA attention's outputs and gradients at every real
    token, one row padded, documents packed two to a row."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_step_variants

    from tpu_pretrain.jax_backend.attention import masked_attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 32, 2, 16)), jnp.float32) for _ in range(3))
    real, attend, documents = _padded_documents()
    pallas = bench_step_variants.pallas_attention(masked_attention, interpret=True)
    for docs in (None, documents):
        got, got_grads = _outputs_and_gradients(lambda *a, docs=docs: pallas(*a, attend, docs), (q, k, v), attend)
        want, want_grads = _outputs_and_gradients(lambda *a, docs=docs: masked_attention(*a, attend, docs, path="xla"),
                                                  (q, k, v), attend)
        for g, w in zip((got, *got_grads), (want, *want_grads), strict=True):
            np.testing.assert_allclose(np.asarray(g)[real], np.asarray(w)[real], atol=2e-5)


def _padded_documents():
    """``(real, attend, documents)`` for two rows of 32 tokens, the second padded after 20, two documents in each
    (from 10 and 5): the real tokens as a NumPy mask, the attention's padding, each token's document (0 at padding)."""
    import jax.numpy as jnp
    import numpy as np

    real = np.arange(32)[None] < np.array([32, 20])[:, None]
    documents = np.where(real, (np.arange(32)[None] >= np.array([10, 5])[:, None]) + 1, 0)
    return real, jnp.asarray(real), jnp.asarray(documents, jnp.int32)


def _outputs_and_gradients(attention, inputs, attend):
    """``(attention(*inputs), the gradients of every input)`` of a loss that reads the real tokens' outputs only."""
    import jax
    import jax.numpy as jnp

    def loss(*a):
        out = attention(*a).astype(jnp.float32)
        return jnp.sum(jnp.where(attend[..., None, None], out * jnp.cos(out), 0.0)), out

    (_, out), grads = jax.value_and_grad(loss, argnums=tuple(range(len(inputs))), has_aux=True)(*inputs)
    return out, grads


def test_short_attention_candidate_is_the_packages_attention_under_padding_and_documents():
    """``pallas_short_attention`` (every key in a program, the backward one kernel summing the query's and value's
    bias gradients too), run by Pallas's interpreter on the CPU at two query blocks per sequence: the package's XLA
    attention of ``q + q_bias`` and ``v + v_bias``, its outputs and the gradients of all five at every real token, one
    row padded, documents packed two to a row; finite everywhere, and zeros for a query that sees no key (padding,
    documents apart)."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import pallas_short_attention

    from tpu_pretrain.jax_backend.attention import masked_attention

    rng = np.random.default_rng(1)
    real, attend, documents = _padded_documents()
    for dtype, tolerance in ((jnp.float32, 2e-6), (jnp.bfloat16, 3e-2)):
        q, k, v = (jnp.asarray(rng.normal(size=(2, 32, 2, 16)), dtype) for _ in range(3))
        q_bias, v_bias = (jnp.asarray(rng.normal(size=(2, 16)), dtype) for _ in range(2))
        for docs in (None, documents):
            ids = pallas_short_attention.ids(attend, docs)

            def short(q, k, v, q_bias, v_bias, ids=ids):  # two blocks of 16 queries: the backward's loop runs twice
                return pallas_short_attention.attention(q, k, v, q_bias, v_bias, *ids, True, (16, 4, 8))

            def package(q, k, v, q_bias, v_bias, docs=docs):
                return masked_attention(q + q_bias, k, v + v_bias, attend, docs, path="xla")

            got, got_grads = _outputs_and_gradients(short, (q, k, v, q_bias, v_bias), attend)
            want, want_grads = _outputs_and_gradients(package, (q, k, v, q_bias, v_bias), attend)
            if docs is not None:  # the padded queries see no key (their documents' id is none of the keys')
                assert not np.asarray(got)[~real].any()
            for index, (g, w) in enumerate(zip((got, *got_grads), (want, *want_grads), strict=True)):
                assert bool(jnp.isfinite(g.astype(jnp.float32)).all())
                g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
                g, w = (g, w) if index > 3 else (g[real], w[real])  # the biases' gradients: every element
                np.testing.assert_allclose(g, w, atol=tolerance * float(np.abs(w).max()))


def test_a_candidate_kernels_tiles_come_from_the_environment_or_its_default(monkeypatch):
    """``support.kernel_tiles``: what ``gpu_session.sh probe`` hands the step's candidates (the tiles fastest alone);
    unset or empty, the module's own; a shape of the wrong length refused by the variable's name."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from support import kernel_tiles

    monkeypatch.delenv("SOME_TILES", raising=False)
    assert kernel_tiles("SOME_TILES", (64, 4, 8)) == (64, 4, 8)
    monkeypatch.setenv("SOME_TILES", "")
    assert kernel_tiles("SOME_TILES", (64, 4, 8)) == (64, 4, 8)
    monkeypatch.setenv("SOME_TILES", "32,4,4")
    assert kernel_tiles("SOME_TILES", (64, 4, 8)) == (32, 4, 4)
    monkeypatch.setenv("SOME_TILES", "32,4")
    with pytest.raises(ValueError, match="SOME_TILES"):
        kernel_tiles("SOME_TILES", (64, 4, 8))
