"""The JAX backend where TensorFlow and bert4keras are not installed (as on Colab's TPU image): the package
imports, trains (on 1 and 2 devices, with accumulation), resumes exactly after SIGKILLs, evaluates, probes and
exports its runs, and exports a Hugging Face model that ``transformers`` runs to the same logits.

``make test-jax-stack`` builds that environment (.venv-jax) and runs these tests there; in an environment
with TensorFlow they are skipped (the parity tests beside them compare the two backends there).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is not None or importlib.util.find_spec("bert4keras") is not None:
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)
pytest.importorskip("jax")

from fault_injection import ENV, STEPS, check_resumed_run, sample_data, train_command  # noqa: E402
from jax_runs import probe_task, use_a_jax_run_to_the_end  # noqa: E402

from tpu_pretrain.errors import UserInputError  # noqa: E402
from tpu_pretrain.jax_backend.input import TrainingBatches, permute  # noqa: E402
from tpu_pretrain.models.run_weights import read_arrays, read_weights  # noqa: E402


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return sample_data(tmp_path_factory.mktemp("jax_data"))


def run_cli(args, env=None, timeout=600):
    """``tpu-pretrain ARGS`` (or a whole command from :func:`train_command`) in a subprocess; its output."""
    command = args if args[0] == sys.executable else [sys.executable, "-m", "tpu_pretrain", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env or ENV, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


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


@pytest.mark.slow
def test_trains_on_two_devices_as_on_one_and_loads_no_tensorflow(data_dir, tmp_path):
    """2 logical CPU devices with 2 accumulated micro-batches make the same updates as 1 device; training,
    evaluating, exporting, probing and the status of a run never load TensorFlow, tf-keras or bert4keras."""
    one = tmp_path / "one"
    task = probe_task(Path(data_dir).parent / "corpus.txt", tmp_path / "task.tsv")
    used = use_a_jax_run_to_the_end(train_command(data_dir, one, steps=8, extra=[*JAX_ARGS, *NO_DROPOUT])[3:], one,
                                    task)
    assert used["loaded"] == [] and used["backend"] == "jax"
    assert (one / "export" / "hf" / "model.safetensors").is_file() and (one / "probe.json").is_file()
    assert json.loads((one / "evaluation.json").read_text())["metrics"]["mlm_loss"] > 0
    two = tmp_path / "two"
    env = {**ENV, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    accumulate = ["--gradient_accumulation_steps", "2"]
    output = run_cli(train_command(data_dir, two, steps=8, extra=[*JAX_ARGS, *NO_DROPOUT, *accumulate]), env=env)
    assert "2 device(s)" in json.loads((two / "train_summary.json").read_text())["accelerator"]
    assert "Trained to step 8" in output
    a, b = read_weights(one / "checkpoints" / "ckpt-000000008"), read_weights(two / "checkpoints" / "ckpt-000000008")
    for name in a:
        np.testing.assert_allclose(b[name], a[name], atol=2e-6, rtol=0, err_msg=name)


def final_weights(run_dir, step=STEPS):
    return read_weights(Path(run_dir) / "checkpoints" / f"ckpt-{step:09d}")


@pytest.mark.slow
def test_sigkilled_jax_training_resumes_to_the_same_weights_and_examples(data_dir, tmp_path):
    check_resumed_run(data_dir, tmp_path, final_weights, extra=JAX_ARGS)
    state = read_arrays(tmp_path / "interrupted" / "checkpoints" / f"ckpt-{STEPS:09d}")
    assert int(state["step"]) == STEPS and any(name.startswith("m/") for name in state)


@pytest.mark.slow
def test_a_jax_trained_model_exported_to_hugging_face_gives_the_same_logits_in_transformers(data_dir, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tpu_pretrain.core.run_folder import RunFolder
    from tpu_pretrain.data.data_folder import read_data_info
    from tpu_pretrain.jax_backend.input import eval_batches
    from tpu_pretrain.jax_backend.model import build_model, from_google, google_variables

    run = tmp_path / "run"
    run_cli(train_command(data_dir, run, steps=12, extra=JAX_ARGS))
    folder = Path(run_cli(["export", str(run), "--format", "hf"]).split(" to ")[-1].strip())
    model = build_model(RunFolder(run).read_model_config(), 64, 10)
    for name, value in read_weights(run / "checkpoints" / "ckpt-000000012").items():
        google_variables(model)[name].assign(from_google(name, value))
    batch = next(eval_batches(read_data_info(data_dir).eval_files, 4, 64, 10))
    ours = [np.asarray(x) for x in model([batch["input_ids"], batch["segment_ids"], batch["masked_lm_positions"]])]

    hf = transformers.BertForPreTraining.from_pretrained(folder).eval()
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["input_ids"] != 0, dtype=torch.long))
    positions = torch.tensor(batch["masked_lm_positions"], dtype=torch.long)
    logits = out.prediction_logits
    theirs = torch.gather(logits, 1, positions[:, :, None].expand(-1, -1, logits.shape[-1]))
    nsp = float(np.max(np.abs(out.seq_relationship_logits.numpy() - ours[1])))
    print(f"MLM logits: max abs difference {float(np.max(np.abs(theirs.numpy() - ours[0]))):.3g}; NSP {nsp:.3g}")
    np.testing.assert_allclose(theirs.numpy(), ours[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(out.seq_relationship_logits.numpy(), ours[1], atol=1e-4, rtol=0)
    assert os.path.isfile(folder / "tokenizer.json")
    again = tmp_path / "from_hf"  # and back: a JAX run started from the export sees the same weights
    run_cli(train_command(data_dir, again, steps=4, extra=[*JAX_ARGS, "--init_checkpoint", str(folder)]))
    final = json.loads((run / "train_summary.json").read_text())["final_eval"]
    initial = json.loads((again / "train_summary.json").read_text())["initial_eval"]
    assert initial["mlm_loss"] == pytest.approx(final["mlm_loss"], rel=1e-5)


def test_bfloat16_computes_in_bfloat16_and_keeps_float32_weights(data_dir, tmp_path):
    from tpu_pretrain.config import Config
    from tpu_pretrain.jax_backend.input import BATCH_FEATURES, eval_batches
    from tpu_pretrain.jax_backend.step import gradients
    from tpu_pretrain.jax_backend.trainer import JaxTrainer

    losses = {}
    for precision in ("float32", "bfloat16"):
        trainer = JaxTrainer(Config.load(data_dir=data_dir, output_dir=str(tmp_path), model_size="L2-H128",
                                         train_batch_size=8, mixed_precision=precision, hidden_dropout_prob=0.0,
                                         num_train_steps=10, num_warmup_steps=1))
        batch = next(eval_batches(trainer.data.train_files, 8, 64, 10))
        grads, stats, _ = gradients(trainer.spec, trainer.state, {k: batch[k] for k in BATCH_FEATURES})
        losses[precision] = float(stats["mlm_loss_sum"] / stats["mlm_weight"])
        assert trainer.model.blocks[0].compute_dtype == precision
        assert all(p.dtype == np.float32 for p in trainer.state["params"]) and all(g.dtype == np.float32 for g in grads)
    print("MLM loss float32 vs bfloat16:", losses)
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=2e-2)
