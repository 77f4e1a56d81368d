"""The JAX backend where TensorFlow and bert4keras are not installed (as on Colab's TPU image): the package
imports, trains (on 1 and 2 devices, with accumulation), resumes exactly after SIGKILLs, evaluates, probes and
exports its runs, and exports a Hugging Face model that ``transformers`` runs to the same logits.

``make test-jax-stack`` builds that environment (.venv-jax) and runs these tests there; in an environment
with TensorFlow they are skipped (the parity tests beside them compare the two backends there).
"""

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is not None or importlib.util.find_spec("bert4keras") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
pytest.importorskip("jax")

from fault_injection import ENV, QUICK_XLA, example_ids_by_step, sample_data, train_command  # noqa: E402
from jax_runs import probe_task, use_a_jax_run_to_the_end  # noqa: E402

from tpu_pretrain.errors import UserInputError  # noqa: E402
from tpu_pretrain.jax_backend.input import TrainingBatches, permute  # noqa: E402
from tpu_pretrain.models.run_weights import read_arrays, read_weights  # noqa: E402


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("jax_data"))


def test_no_tensorflow_here_and_the_backend_is_chosen_for_it(tmp_path, capsys):
    from tpu_pretrain.backend import choose_backend
    from tpu_pretrain.cli import main

    backend, reason = choose_backend("auto")
    assert backend == "jax" and "not installed" in reason
    with pytest.raises(UserInputError, match="--backend jax"):
        choose_backend("tensorflow")
    assert main(["evaluate", str(tmp_path)]) == 2  # said plainly, not an ImportError
    assert "neither a run folder" in capsys.readouterr().err


def test_order_is_a_pure_function_of_seed_and_records_consumed(data_dir):
    from tpu_pretrain.data.data_folder import read_data_info

    info = read_data_info(data_dir)
    n = info.train_instances
    assert sorted(permute(np.arange(n), n, seed=3, epoch=0)) == list(range(n))  # a permutation of the epoch
    assert not np.array_equal(permute(np.arange(n), n, 3, 0), permute(np.arange(n), n, 3, 1))
    first = TrainingBatches(info.train_files, 8, 64, 10, seed=3)
    batches = [next(first) for _ in range(n // 8 + 3)]  # into the second epoch
    first.close()
    ids = np.concatenate([b[0] for b in batches])
    assert len(set(ids[:n].tolist())) == n  # each record once per epoch
    resumed = TrainingBatches(info.train_files, 8, 64, 10, seed=3, start_record=8 * (n // 8 + 1))
    again = next(resumed)
    resumed.close()
    np.testing.assert_array_equal(again[0], batches[n // 8 + 1][0])
    np.testing.assert_array_equal(again[1]["input_ids"], batches[n // 8 + 1][1]["input_ids"])


def test_every_weight_matrix_gets_its_own_draw():
    from tpu_pretrain.jax_backend.model import build_model, google_variables
    from tpu_pretrain.models.bert_config import bert_config_for_size

    model = build_model(bert_config_for_size("L2-H128", 500), 32, 5)
    weights = {name: np.asarray(v.value) for name, v in google_variables(model).items()}
    prefix = "bert/encoder/layer_0/attention/"
    q, k, v = (weights[f"{prefix}self/{n}/kernel"] for n in ("query", "key", "value"))
    output = weights[f"{prefix}output/dense/kernel"]
    assert not np.allclose(q, k) and not np.allclose(k, v) and not np.allclose(q, output)
    assert 0.015 < q.std() < 0.02 and np.abs(q).max() <= 0.04 + 1e-6  # truncated at 2 standard deviations
    assert np.all(weights[f"{prefix}output/LayerNorm/gamma"] == 1) and np.all(weights[f"{prefix}self/query/bias"] == 0)


JAX_ARGS = ["--backend", "jax", "--steps_per_execution", "4"]  # a call per checkpoint: one compilation
NO_DROPOUT = ["--hidden_dropout_prob", "0"]  # other micro-batch shapes draw other masks


def quick(devices: int = 1) -> dict:
    """The training processes' environment: ``devices`` CPU devices, and XLA's unoptimised code (level 0), which
    compiles in about half the CPU time: these runs take a few steps."""
    return {**ENV, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {QUICK_XLA}"}


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """The runs the two tests below check, made side by side (two cores): 8 steps without dropout on 1 device, that
    run then used to the end in the same process (evaluate, export hf, probe, status: :func:`use_a_jax_run_to_the_end`),
    and the same training on 2 logical CPU devices with 2 accumulated micro-batches (with its output)."""
    root = tmp_path_factory.mktemp("trained")
    one, two = root / "one", root / "two"
    accumulate = ["--gradient_accumulation_steps", "2"]
    beside = subprocess.Popen(train_command(data_dir, two, steps=8, extra=[*JAX_ARGS, *NO_DROPOUT, *accumulate]),
                              env=quick(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        task = probe_task(Path(data_dir).parent / "corpus.txt", root / "task.tsv")
        used = use_a_jax_run_to_the_end(train_command(data_dir, one, steps=8, extra=[*JAX_ARGS, *NO_DROPOUT])[3:],
                                        one, task, env=quick())
        output, errors = beside.communicate(timeout=600)
    finally:
        beside.kill()
    assert beside.returncode == 0, errors[-3000:]
    return {"one": one, "used": used, "two": two, "two_output": output}


@pytest.mark.slow
def test_trains_on_two_devices_as_on_one_and_loads_no_tensorflow(trained):
    """2 logical CPU devices with 2 accumulated micro-batches make the same updates as 1 device; training,
    evaluating, exporting, probing and the status of a run never load TensorFlow, tf-keras or bert4keras."""
    one, two, used = trained["one"], trained["two"], trained["used"]
    assert used["loaded"] == [] and used["backend"] == "jax"
    assert (one / "export" / "hf" / "model.safetensors").is_file() and (one / "probe.json").is_file()
    assert json.loads((one / "evaluation.json").read_text())["metrics"]["mlm_loss"] > 0
    assert "1 device(s)" in json.loads((one / "train_summary.json").read_text())["accelerator"]
    assert "2 device(s)" in json.loads((two / "train_summary.json").read_text())["accelerator"]
    assert "Trained to step 8" in trained["two_output"]
    a, b = read_weights(one / "checkpoints" / "ckpt-000000008"), read_weights(two / "checkpoints" / "ckpt-000000008")
    for name in a:
        np.testing.assert_allclose(b[name], a[name], atol=2e-6, rtol=0, err_msg=name)


KILLED_STEPS = 24


def kill_once(command: list[str], ready) -> None:
    """Start ``command`` and SIGKILL it the moment ``ready()`` holds (looked at every 2 ms)."""
    process = subprocess.Popen(command, env=quick(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while process.poll() is None and not ready() and time.monotonic() < deadline:
            time.sleep(0.002)
        process.send_signal(signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL, f"it ended (exit code {process.returncode}) before the kill"
        assert ready(), "killed at the deadline, not when it was ready"
    finally:
        process.kill()


@pytest.mark.slow
def test_sigkilled_jax_training_resumes_to_the_same_weights_and_examples(data_dir, tmp_path):
    """A run SIGKILLed among its steps (as its checkpoint of step 8 is done), then again while it writes its next
    checkpoint, and started a third time with the same command, resumes from a checkpoint and ends in the state of an
    uninterrupted run (trained beside it): the same weights, Adam moments, step and dropout RNG, and the same
    examples at every step (the steps replayed after a kill too), with dropout on."""
    reference, run = tmp_path / "reference", tmp_path / "interrupted"
    command, checkpoints = train_command(data_dir, run, steps=KILLED_STEPS, extra=JAX_ARGS), run / "checkpoints"
    uninterrupted = subprocess.Popen(train_command(data_dir, reference, steps=KILLED_STEPS, extra=JAX_ARGS),
                                     env=quick(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        kill_once(command, lambda: (checkpoints / "ckpt-000000008").is_dir())  # steps 9 to 12 under way
        before = set(checkpoints.glob(".ckpt-*.tmp-*"))
        kill_once(command, lambda: bool(set(checkpoints.glob(".ckpt-*.tmp-*")) - before))  # a checkpoint written
        _, errors = uninterrupted.communicate(timeout=600)
    finally:
        uninterrupted.kill()
    assert uninterrupted.returncode == 0, errors[-3000:]
    last = f"ckpt-{KILLED_STEPS:09d}"
    assert not (checkpoints / last).exists()
    final = subprocess.run(command, env=quick(), capture_output=True, text=True, timeout=600)
    assert final.returncode == 0 and f"Resuming from {checkpoints}" in final.stderr, final.stderr[-3000:]

    expected, got = read_arrays(reference / "checkpoints" / last), read_arrays(checkpoints / last)
    assert expected.keys() == got.keys() and any(name.startswith("m/") for name in got), sorted(got)
    assert int(got["step"]) == KILLED_STEPS
    worst = max(float(np.abs(got[n].astype(np.float64) - expected[n]).max()) for n in expected)
    print(f"max abs difference of the state after 2 SIGKILLs: {worst:.3g}")
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-6, rtol=0, err_msg=name)
    reference_ids, resumed_ids = example_ids_by_step(reference), example_ids_by_step(run)
    assert sorted(resumed_ids) == list(range(1, KILLED_STEPS + 1))
    assert resumed_ids == reference_ids  # the same examples at every step: none repeated, none skipped


@pytest.mark.slow
def test_a_jax_trained_model_exported_to_hugging_face_gives_the_same_logits_in_transformers(data_dir, trained,
                                                                                            tmp_path):
    """The ``export --format hf`` of a JAX run gives transformers' BertForPreTraining our MLM and NSP logits, and a
    JAX run started from that folder (``--init_checkpoint``) evaluates as the exported run did at its end."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tpu_pretrain.core.run_folder import RunFolder
    from tpu_pretrain.data.data_folder import read_data_info
    from tpu_pretrain.jax_backend.input import eval_batches
    from tpu_pretrain.jax_backend.model import build_model, from_google, google_variables

    run, folder, again = trained["one"], trained["one"] / "export" / "hf", tmp_path / "from_hf"
    # and back, trained beside the comparison: the exported run's settings (its compiled step, from the cache)
    from_hf = subprocess.Popen(train_command(data_dir, again, steps=8, extra=[*JAX_ARGS, *NO_DROPOUT,
                                                                              "--init_checkpoint", str(folder)]),
                               env=quick(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        model = build_model(RunFolder(run).read_model_config(), 64, 10)
        for name, value in read_weights(run / "checkpoints" / "ckpt-000000008").items():
            google_variables(model)[name].assign(from_google(name, value))
        batch = next(eval_batches(read_data_info(data_dir).eval_files, 4, 64, 10))
        ours = [np.asarray(x) for x in model([batch["input_ids"], batch["segment_ids"], batch["masked_lm_positions"]])]

        hf = transformers.BertForPreTraining.from_pretrained(folder).eval()
        with torch.no_grad():
            out = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                     token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(batch["input_ids"] != 0, dtype=torch.long))
        _, errors = from_hf.communicate(timeout=600)
    finally:
        from_hf.kill()
    positions = torch.tensor(batch["masked_lm_positions"], dtype=torch.long)
    logits = out.prediction_logits
    theirs = torch.gather(logits, 1, positions[:, :, None].expand(-1, -1, logits.shape[-1]))
    nsp = float(np.max(np.abs(out.seq_relationship_logits.numpy() - ours[1])))
    print(f"MLM logits: max abs difference {float(np.max(np.abs(theirs.numpy() - ours[0]))):.3g}; NSP {nsp:.3g}")
    np.testing.assert_allclose(theirs.numpy(), ours[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(out.seq_relationship_logits.numpy(), ours[1], atol=1e-4, rtol=0)
    assert os.path.isfile(folder / "tokenizer.json")
    assert from_hf.returncode == 0, errors[-3000:]  # a JAX run started from the export sees the same weights
    final = json.loads((run / "train_summary.json").read_text())["final_eval"]
    initial = json.loads((again / "train_summary.json").read_text())["initial_eval"]
    assert initial["mlm_loss"] == pytest.approx(final["mlm_loss"], rel=1e-5)


def test_bfloat16_computes_in_bfloat16_and_keeps_float32_weights(data_dir, tmp_path):
    """``mixed_precision=bfloat16``: the model's layers compute in bfloat16, its weights and their gradients are
    float32 (the gradients' dtypes as JAX traces the training step's ``gradients``, without compiling its
    backward pass), and its loss on a batch (compiled, forward) is float32's within 2%."""
    import functools

    import jax

    from tpu_pretrain.config import Config
    from tpu_pretrain.jax_backend.input import BATCH_FEATURES, eval_batches
    from tpu_pretrain.jax_backend.step import gradients, loss
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    losses = {}
    for precision in ("float32", "bfloat16"):
        trainer = JaxTrainer(Config.load(data_dir=data_dir, output_dir=str(tmp_path), model_size="L2-H128",
                                         train_batch_size=8, mixed_precision=precision, hidden_dropout_prob=0.0,
                                         num_train_steps=10, num_warmup_steps=1))
        batch = next(eval_batches(trainer.data.train_files, 8, 64, 10))
        features = {k: batch[k] for k in BATCH_FEATURES}
        grads = jax.eval_shape(functools.partial(gradients, trainer.spec), trainer.state, features)[0]
        weight = max(float(features["masked_lm_weights"].sum()), 1.0)  # the global batch's, as gradients has it
        _, (stats, _) = jax.jit(functools.partial(loss, trainer.spec))(trainer.state["params"], trainer.state["keras"],
                                                                      features, weight, 8.0)
        losses[precision] = float(stats["mlm_loss_sum"] / stats["mlm_weight"])
        assert trainer.model.blocks[0].compute_dtype == precision
        assert all(p.dtype == np.float32 for p in trainer.state["params"]) and all(g.dtype == np.float32 for g in grads)
    print("MLM loss float32 vs bfloat16:", losses)
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=2e-2)
