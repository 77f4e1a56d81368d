"""``benchmarks/bench_step_numerics.py``, the card's check that its assembled step computes what the CPU's does, run
here with the CPU in bfloat16 as the candidate: the step as it is passes on both batches and over two steps,
bfloat16's own error showing, for BERT and ModernBERT, and so do the GPU's forms run on this CPU as far as they can
be; a form wrong in the candidate's step alone (as a GPU-only form would be) is found, and named."""

import argparse
import contextlib
import functools
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("jax")  # in .venv-jax only (tests/jax_backend/conftest.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_step_numerics as numerics  # noqa: E402
from jaxprs import equations  # noqa: E402


def shape(family: str) -> argparse.Namespace:
    """A tiny model of ``family`` (ModernBERT on MLM-only data), the candidate the CPU in bfloat16."""
    return argparse.Namespace(model_family=family, model_size="L2-H128", batch=4, seq=32, pred=5, vocab=1000,
                              precision="bfloat16")


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def made(request, tmp_path_factory):
    """``(the three trainers, the two batches, two steps' batches)`` of a tiny model of the family."""
    from tpu_pretrain.jax_backend.input import separator_id

    args = shape(request.param)
    trainers = numerics.trainers(args, str(tmp_path_factory.mktemp("numerics")))
    candidate = trainers["candidate"]
    yield (trainers, numerics.batches(args, separator_id(candidate.model_config, candidate.vocab)),
           [numerics.rows(args, seed=5), numerics.rows(args, seed=7)])
    for t in trainers.values():
        t.close()


def test_the_step_as_it_is_passes_with_bfloat16s_own_error(made):
    made, cases, steps = made
    for case, (batch, separator) in cases.items():
        results = {name: numerics.loss_and_gradients(t, batch, separator) for name, t in made.items()}
        found = numerics.compared(made["candidate"].names, results)
        assert not found["wrong"], (case, found["wrong"])
        base = found["cpu_bfloat16"]
        assert 1e-3 < base["overall"] < 0.05, case  # bfloat16's error: there, and small
        assert base["loss_error"] < 1e-3, case
    found = numerics.compared(made["candidate"].names, {n: numerics.two_steps(t, steps) for n, t in made.items()},
                              "updates")
    assert not found["wrong"], found["wrong"]
    assert 1e-3 < found["cpu_bfloat16"]["overall"] < 0.2  # two steps of bfloat16, each near sign(gradient) x rate


@pytest.mark.parametrize("made", ["bert"], indirect=True)
def test_a_form_wrong_in_the_candidate_alone_is_named(made):
    """The position table added 10% too strongly (rows whole: positions from 0 to the end), in the candidate's step
    only: its gradient is found off by more than the floor (~7%) and named; the loss moves by less than the loss's
    tolerance, so only the gradients show it."""
    from tpu_pretrain.jax_backend import model as model_module

    made, cases, _ = made
    add_bias = model_module.add_bias
    batch, separator = cases["whole"]
    results = {name: numerics.loss_and_gradients(made[name], batch, separator)
               for name in ("cpu_bfloat16", "reference")}
    with mock.patch.object(model_module, "add_bias", lambda x, bias, for_gpu=False: add_bias(x, 1.1 * bias, for_gpu)):
        results["candidate"] = numerics.loss_and_gradients(made["candidate"], batch, separator)
    found = numerics.compared(made["candidate"].names, results)
    assert any(w.startswith("bert/embeddings/position_embeddings ") for w in found["wrong"]), found["wrong"]
    assert found["candidate"]["weights"]["bert/embeddings/position_embeddings"] > numerics.ERROR_FLOOR
    assert found["candidate"]["loss_error"] < numerics.LOSS_TOLERANCE


@contextlib.contextmanager
def gpu_forms_on_this_cpu(trainer):
    """``trainer``'s step traced in a GPU's forms wherever they run on a CPU: the model asks the process's backend
    (no mesh) and is told ``gpu`` (the token table gathered in float32, the GELU, bias sums and projections in their
    GPU forms, the logits as wide as their GEMM), the norms are the Pallas kernels (run by Pallas's interpreter) with
    the dense layers' biases, and a call's bfloat16 copies of the weights are carried; only cuDNN's attention (the
    explicit attention a GPU falls back to instead) and Triton's compile are not a GPU's."""
    from tpu_pretrain.jax_backend import gpu_layer_norm

    mesh, copies = trainer.model.data_mesh, trainer.carry_copies
    trainer.model.data_mesh, trainer.carry_copies = None, True
    try:
        with mock.patch("jax.default_backend", lambda: "gpu"), \
                mock.patch.object(gpu_layer_norm, "target_platform", lambda mesh=None: "cpu"), \
                mock.patch.dict(os.environ, {"TPU_PRETRAIN_LAYERNORM": "pallas"}):
            yield
    finally:
        trainer.model.data_mesh, trainer.carry_copies = mesh, copies


def test_the_gpus_forms_assembled_give_the_cpus_step_where_they_run_here(made):
    """The GPU's step as far as a CPU can run it (:func:`gpu_forms_on_this_cpu`): the reference's loss and gradients on
    both batches, and its two steps' updates, to bfloat16's error, as the CPU's own bfloat16 step. What the card's
    check adds to this: cuDNN's kernels, Triton's compile of the norms, and the GPU's own arithmetic."""
    import jax

    from tpu_pretrain.jax_backend import step

    made, cases, steps = made
    candidate = made["candidate"]
    for case, (batch, separator) in cases.items():
        results = {name: numerics.loss_and_gradients(made[name], batch, separator)
                   for name in ("cpu_bfloat16", "reference")}
        with gpu_forms_on_this_cpu(candidate):
            results["candidate"] = numerics.loss_and_gradients(candidate, batch, separator)
            jaxpr = jax.make_jaxpr(functools.partial(step.gradients, candidate.spec))(
                step.with_copies(candidate.spec, candidate.state, batch), batch).jaxpr
        assert any(e.primitive.name == "pallas_call" for e in equations(jaxpr)), case  # the norms are the kernels
        found = numerics.compared(candidate.names, results)
        assert not found["wrong"], (case, found["wrong"])
        assert results["candidate"][1][0].tobytes() != results["cpu_bfloat16"][1][0].tobytes(), case  # other forms
    results = {name: numerics.two_steps(made[name], steps) for name in ("cpu_bfloat16", "reference")}
    with gpu_forms_on_this_cpu(candidate):
        results["candidate"] = numerics.two_steps(candidate, steps)
    found = numerics.compared(candidate.names, results, "updates")
    assert not found["wrong"], found["wrong"]


@pytest.mark.parametrize("made", ["bert"], indirect=True)
def test_a_second_step_reading_stale_copies_is_found(made):
    """The GPU's step as far as a CPU runs it, its update not writing the weights' bfloat16 copies (the second step
    reads the first's weights): the two steps' updates are found ~40% off the reference, most weights named, where
    the step as it is passes (above)."""
    from tpu_pretrain.jax_backend import step

    made, _, steps = made
    candidate, train_step = made["candidate"], step.train_step

    def stale_copies(spec, state, batch):
        new, stats = train_step(spec, state, batch)
        return {**new, step.COPIES: state[step.COPIES]}, stats

    results = {name: numerics.two_steps(made[name], steps) for name in ("cpu_bfloat16", "reference")}
    with gpu_forms_on_this_cpu(candidate), mock.patch.object(step, "train_step", stale_copies):
        results["candidate"] = numerics.two_steps(candidate, steps)
    found = numerics.compared(candidate.names, results, "updates")
    assert found["candidate"]["overall"] > 10 * found["cpu_bfloat16"]["overall"]
    assert f"updates {found['candidate']['overall']:.2%} off overall" in found["wrong"]
    assert len(found["wrong"]) > len(candidate.names) // 2
