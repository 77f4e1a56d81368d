"""``benchmarks/bench_step_numerics.py``, the card's check that its assembled step computes what the CPU's does, run
here with the CPU in bfloat16 as the candidate: the step as it is passes on both batches, bfloat16's own error
showing; a form wrong in the candidate's step alone (as a GPU-only form would be) is found, and named."""

import argparse
import sys
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("jax")  # in .venv-jax only (tests/jax_backend/conftest.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_step_numerics as numerics  # noqa: E402

ARGS = argparse.Namespace(model_size="L2-H128", batch=4, seq=32, pred=5, vocab=1000, precision="bfloat16")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    trainers = numerics.trainers(ARGS, str(tmp_path_factory.mktemp("numerics")))
    yield trainers
    for t in trainers.values():
        t.close()


@pytest.fixture(scope="module")
def cases(made):
    from tpu_pretrain.jax_backend.input import separator_id

    candidate = made["candidate"]
    return numerics.batches(ARGS, separator_id(candidate.model_config, candidate.vocab))


def test_the_step_as_it_is_passes_with_bfloat16s_own_error(made, cases):
    for case, (batch, separator) in cases.items():
        results = {name: numerics.loss_and_gradients(t, batch, separator) for name, t in made.items()}
        found = numerics.compared(made["candidate"].names, results)
        assert not found["wrong"], (case, found["wrong"])
        base = found["cpu_bfloat16"]
        assert 1e-3 < base["overall"] < 0.05, case  # bfloat16's error: there, and small
        assert base["loss_error"] < 1e-3, case


def test_a_form_wrong_in_the_candidate_alone_is_named(made, cases):
    """The position table added 10% too strongly (rows whole: positions from 0 to the end), in the candidate's step
    only: its gradient is found off by more than the floor (~7%) and named; the loss moves by less than the loss's
    tolerance, so only the gradients show it."""
    from tpu_pretrain.jax_backend import model as model_module

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
