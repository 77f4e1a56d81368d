"""The loop keeps the devices busy (:func:`tpu_pretrain.core.loop.run_training` with the real JAX trainer): calls end
at log, eval and save boundaries with one compiled call for every length (no train of single-step calls), each call
is dispatched before the last one's figures are read, and between two dispatches the host syncs once, for those
figures; the state is read only where an eval, a save or the end needs it.

Runs in the environment without TensorFlow (``make test-jax-stack``), as the other trainer tests do.
"""

import numpy as np
import pytest

pytest.importorskip("jax")

from test_input_overlap import settings, write_data  # noqa: E402  (skips this module where TensorFlow is installed)

from tpu_pretrain.config import Config  # noqa: E402


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("pacing"))


def traced_run(data_dir, output_dir, monkeypatch, full_calls_counted=False, **overrides):
    """Train through the loop, recording each dispatch, each read of a call's figures and every host sync
    (``full_calls_counted``: full calls compiled with their trip count, as on a GPU)."""
    from tpu_pretrain.core.loop import run_training
    from tpu_pretrain.jax_backend import trainer as trainer_module

    events: list[tuple] = []
    fetch = trainer_module.fetch
    monkeypatch.setattr(trainer_module, "fetch", lambda tree: (events.append(("sync",)), fetch(tree))[1])
    trainer = trainer_module.JaxTrainer(Config.load(**settings(data_dir, output_dir, **overrides)))
    trainer.full_calls_counted = full_calls_counted
    dispatch, step = trainer.dispatch, [0]

    def logged(n):
        call = dispatch(n)
        first, last = step[0], step[0] + n
        step[0] = last
        events.append(("dispatch", first, last))
        read = call.read
        call.read = lambda pending: (events.append(("read", first, last)), read(pending))[1]
        return call

    trainer.dispatch = logged
    events.clear()
    result = run_training(trainer, str(output_dir), progress=False)
    return result, trainer, events


def test_calls_fit_the_boundaries_and_are_read_one_call_late(data_dir, tmp_path, monkeypatch):
    result, trainer, events = traced_run(data_dir, tmp_path / "run", monkeypatch, num_train_steps=14,
                                         steps_per_execution=4, log_every_steps=5, save_checkpoints_steps=10)
    calls = [(e[1], e[2]) for e in events if e[0] == "dispatch"]
    # log at 5 and 10, save at 10, the end at 14: each stretch in as few calls as steps_per_execution allows
    assert calls == [(0, 4), (4, 5), (5, 9), (9, 10), (10, 14)]
    assert trainer._train_chunk._cache_size() == 1  # one compiled call for the lengths 4 and 1
    assert result.steps == 14 and [h["step"] for h in result.history] == [4, 5, 9, 10, 14]
    states = {10, 14}  # where a save (or the end) needs the state: nothing may be in flight there
    for first, last in calls:
        read = events.index(("read", first, last))
        later = [e for e in events[read:] if e[0] == "dispatch"]
        dispatched_next = any(e[1] == last for e in events[:read] if e[0] == "dispatch")
        assert dispatched_next or last in states, f"call {first}-{last} was read before the next was dispatched"
        if last in states:
            assert not later or later[0][1] == last  # the next call starts from the saved state, after the read
    dispatches = [i for i, e in enumerate(events) if e[0] == "dispatch"]
    for n, (i, j) in enumerate(zip(dispatches, dispatches[1:], strict=False)):
        if calls[n][1] not in states:  # between two dispatches: one sync, for the figures of the call before
            assert sum(e[0] == "sync" for e in events[i + 1:j]) == (1 if n else 0)


def test_where_full_calls_are_counted_they_are_a_call_of_their_own_and_train_the_same_steps(
        data_dir, tmp_path, monkeypatch):
    """As on a GPU (whose while loop otherwise waits on the host after every step): a full call is compiled with its
    trip count (XLA's loop then knows it), a shorter one takes the call that loops to a count, compiled when first
    needed; the run trains exactly what the one-call run trains, and the boundaries and syncs are the same."""
    import jax
    import numpy as np

    kept = dict(num_train_steps=14, steps_per_execution=4, log_every_steps=5, save_checkpoints_steps=10)
    counted, trainer, events = traced_run(data_dir, tmp_path / "counted", monkeypatch, full_calls_counted=True,
                                          **kept)
    assert [(e[1], e[2]) for e in events if e[0] == "dispatch"] == [(0, 4), (4, 5), (5, 9), (9, 10), (10, 14)]
    assert trainer._train_chunk._cache_size() == 2  # the full call, and the one that loops to a count
    full = trainer._train_chunk.lower(trainer.state, trainer.chunk_shapes(4)).compile().as_text()
    assert '"known_trip_count":{"n":"4"}' in full  # the compiler knows it (the GPU's loop then never reads a flag)
    assert "known_trip_count" not in trainer.lower_chunk(4).compile().as_text()
    weights = jax.tree.map(np.asarray, trainer.state["params"])
    one_call, plain, _ = traced_run(data_dir, tmp_path / "plain", monkeypatch, **kept)
    assert plain._train_chunk._cache_size() == 1
    assert [h["loss"] for h in counted.history] == [h["loss"] for h in one_call.history]
    for a, b in zip(weights, jax.tree.map(np.asarray, plain.state["params"]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_summary_rate_leaves_the_compile_out(data_dir, tmp_path, monkeypatch, caplog):
    with caplog.at_level("INFO", logger="tpu_pretrain.core"):
        result, _, _ = traced_run(data_dir, tmp_path / "run", monkeypatch, num_train_steps=12,
                                  steps_per_execution=2, log_every_steps=4, save_checkpoints_steps=12)
    compiled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiled the training call")]
    assert len(compiled) == 1 and result.compile_seconds > 0 and "compiled in" in result.summary()
    # the steady rate leaves the compile out: with it averaged in, 12 steps of 8 sequences could not reach it
    assert result.examples_per_second * result.compile_seconds > 12 * 8
    assert result.history[-1]["examples_per_second"] == pytest.approx(result.examples_per_second)


def test_the_rate_counts_each_call_from_the_end_of_the_one_before_when_dispatching_holds_the_host(
        data_dir, tmp_path, monkeypatch):
    """On a GPU, dispatching a call holds the host until the call has about run (XLA's while loop reads its condition
    on the host), so a call is read a whole call after it ended. Emulated here by a dispatch that waits for its call:
    timed by their readings, the calls after the first looked a call shorter than they were (an H100 run showed
    twice its speed at its first progress line); timed by when they ended, the rate is the calls' own."""
    import time

    import jax

    from tpu_pretrain.core.loop import run_training
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    trainer = JaxTrainer(Config.load(**settings(data_dir, tmp_path / "run", num_train_steps=24, steps_per_execution=4,
                                                train_batch_size=32, log_every_steps=8, save_checkpoints_steps=24)))
    dispatch, ran = trainer.dispatch, []

    def holding(n):
        tick = time.perf_counter()
        call = dispatch(n)
        jax.block_until_ready(call.sums)
        ran.append((n, time.perf_counter() - tick))
        return call

    trainer.dispatch = holding
    result = run_training(trainer, str(tmp_path / "run"), progress=False)
    steady = ran[1:]  # the first call (the compile) is left out of the rate
    own = sum(n for n, _ in steady) / sum(seconds for _, seconds in steady) * 32
    # the calls' own rate is an upper bound (the loop's reading and logging between calls add to the steady time);
    # timed by their readings, the rate over these five calls came out a call's worth (a quarter) above it
    assert result.examples_per_second <= 1.1 * own, (result.examples_per_second, own)
    assert result.examples_per_second >= 0.6 * own, (result.examples_per_second, own)
    shown = [h["examples_per_second"] for h in result.history]
    assert max(shown[1:]) <= 1.5 * own, shown  # timed by its reading, the first steady call showed several times it


def test_weights_copies_carried_through_a_call_train_exactly_as_casting_each_step(data_dir, tmp_path):
    """A GPU's call carries the weights' bfloat16 copies through its steps (``step.with_copies``: the update writes
    them, where each step's forward pass would cast every weight again, 162 small kernels per BERT-base step). Forced
    on the CPU in mixed bfloat16: the matrices and biases get copies, the norms' scales and offsets (read in float32)
    and the token table (read twice) do not; trained through the loop, the same weights, moments and losses,
    exactly."""
    import jax

    from tpu_pretrain.core.loop import run_training
    from tpu_pretrain.jax_backend.devices import fetch
    from tpu_pretrain.jax_backend.step import MODEL_INPUTS, gradients, read_dtypes, with_copies
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    runs = {}
    for carry in (False, True):
        trainer = JaxTrainer(Config.load(**settings(data_dir, tmp_path / f"run{carry}", num_train_steps=8,
                                                    steps_per_execution=4, mixed_precision="bfloat16",
                                                    save_checkpoints_steps=8)))
        trainer.carry_copies = carry
        trainer._compile()  # the spec, with the setting, into the compiled steps
        if carry:
            batch = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in trainer.chunk_shapes(1).items()}
            dtypes = dict(zip(trainer.names, read_dtypes(trainer.model.stateless_call, trainer.state["params"],
                                                         trainer.state["keras"], [batch[k] for k in MODEL_INPUTS]),
                              strict=True))
            assert dtypes["bert/encoder/layer_0/attention/self/query/kernel"] == "bfloat16"
            assert dtypes["bert/encoder/layer_1/output/dense/bias"] == "bfloat16"
            assert dtypes["cls/predictions/output_bias"] == "bfloat16"
            # read twice (its gather and the MLM head's product): its gradients add up in float32, not in a copy's dtype
            assert dtypes["bert/embeddings/word_embeddings"] is None
            assert dtypes["bert/encoder/layer_0/attention/output/LayerNorm/gamma"] is None
            # the step reads the copies, not the weights: zeroed copies change the loss
            real = {k: np.ones(v.shape, v.dtype) for k, v in batch.items()}
            state = with_copies(trainer.spec, trainer.state, real)
            zeroed = {**state, "copies": [c if c is None else c * 0 for c in state["copies"]]}
            losses = [gradients(trainer.spec, s, real)[1]["mlm_loss_sum"] for s in (state, zeroed)]
            assert losses[0] != losses[1], losses
        result = run_training(trainer, str(tmp_path / f"run{carry}"), progress=False)
        runs[carry] = ([h["loss"] for h in result.history], fetch(trainer.state))
        trainer.close()
    (losses, state), (carried_losses, carried) = runs[False], runs[True]
    assert "copies" not in carried and losses == carried_losses
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(carried), strict=True):
        np.testing.assert_array_equal(a, b)
