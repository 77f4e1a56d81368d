"""A run trained with --backend jax is evaluated, exported, probed and inspected by the JAX backend, never loading
TensorFlow, though TensorFlow is installed here (as on Kaggle's TPU image); and the TensorFlow model, given the
same weights, gives the same held-out figures, fill-mask probabilities, probe features and Google export.

Each backend runs in a process of its own: bert4keras makes the name ``keras`` mean tf-keras in its process.
``tests/jax_backend/test_jax_stack.py`` runs the same JAX process where TensorFlow is not installed at all.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("jax") is None:
    pytest.skip("for the environment with both backends (test_jax_stack covers the one without TensorFlow)",
                allow_module_level=True)

from fault_injection import sample_data  # noqa: E402
from jax_runs import SENTENCES, probe_task, train_arguments, use_a_jax_run_to_the_end  # noqa: E402

from tpu_pretrain.models.run_weights import read_weights  # noqa: E402
from tpu_pretrain.models.tf_bundle import read_tensors  # noqa: E402


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("jax_run")
    data_dir = sample_data(root, max_chars=40_000, num_shards=2)
    task = probe_task(root / "corpus.txt", root / "task.tsv")
    used = use_a_jax_run_to_the_end(train_arguments(data_dir, root / "run"), root / "run", task)
    return root, used


@pytest.mark.slow
def test_a_jax_run_is_evaluated_exported_probed_and_inspected_without_tensorflow(jax_run):
    root, used = jax_run
    assert used["loaded"] == [] and used["backend"] == "jax"
    run = root / "run"
    evaluation = json.loads((run / "evaluation.json").read_text())
    manifest = json.loads((root / "data" / "manifest.json").read_text())
    held_out = sum(s["instances"] for s in manifest["shards"] if s["split"] == "eval")
    assert evaluation["step"] == 24 and evaluation["eval_examples"] == held_out and held_out % 8  # a short last batch
    assert [len(item["masks"]) for item in evaluation["fill_mask"]] == [1, 2]
    assert "is_next_probability" in evaluation["fill_mask"][1]  # the sentence with [SEP]
    assert (run / "export" / "hf" / "model.safetensors").is_file() and (run / "probe.json").is_file()
    assert "step 24 of 24" in used["stdout"] and "pretrained encoder:" in used["stdout"]


TENSORFLOW_SIDE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from tpu_pretrain.data.tokenization import load_tokenizer
    from tpu_pretrain.export.evaluate import evaluate
    from tpu_pretrain.export.probe import encode_texts, pooled_features, read_task
    from tpu_pretrain.export.rebuild import load_trained_model
    from tpu_pretrain.export.writers import export
    run, task, sentences = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    trained = load_trained_model(run, backend="tensorflow")
    evaluate(run, sentences=sentences, max_eval_steps=0, eval_batch_size=8, output=run + "/tf_evaluation.json",
             trained=trained)
    ids, segments = encode_texts(load_tokenizer(trained.vocab_file, trained.do_lower_case), read_task(task)[0], 64)
    np.save(run + "/tf_features.npy", pooled_features(trained.model, ids, segments))
    export(run, "tf", run + "/export/google", trained=trained)
    print("BACKEND", trained.model.backend)
""")


@pytest.mark.slow
def test_the_tensorflow_model_gives_the_same_figures_from_the_same_weights(jax_run):
    root, _ = jax_run
    run = root / "run"
    done = subprocess.run([sys.executable, "-c", TENSORFLOW_SIDE, str(run), str(root / "task.tsv"),
                           json.dumps(SENTENCES)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0 and "BACKEND tensorflow" in done.stdout, done.stderr[-3000:]
    jax, tf = (json.loads((run / name).read_text()) for name in ("evaluation.json", "tf_evaluation.json"))
    print("JAX:", jax["metrics"], "\nTensorFlow:", tf["metrics"])
    assert jax["eval_examples"] == tf["eval_examples"] and 0 < jax["metrics"]["mlm_accuracy"] < 1
    for key in ("mlm_loss", "nsp_loss", "loss"):
        assert tf["metrics"][key] == pytest.approx(jax["metrics"][key], rel=1e-5), key
    for key in ("mlm_accuracy", "nsp_accuracy"):
        assert tf["metrics"][key] == pytest.approx(jax["metrics"][key], abs=1e-6), key
    for ours, theirs in zip(jax["fill_mask"], tf["fill_mask"], strict=True):
        assert ours["filled"] == theirs["filled"] and ours.keys() == theirs.keys()
        assert ours.get("is_next_probability", 0) == pytest.approx(theirs.get("is_next_probability", 0), rel=1e-4)
        for a, b in zip(ours["masks"], theirs["masks"], strict=True):
            assert [c["word"] for c in a["candidates"]] == [c["word"] for c in b["candidates"]]
            np.testing.assert_allclose([c["probability"] for c in a["candidates"]],
                                       [c["probability"] for c in b["candidates"]], rtol=1e-4)
    features, tf_features = np.load(run / "features.npy"), np.load(run / "tf_features.npy")
    print(f"probe features: max abs difference {np.abs(features - tf_features).max():.2e}")
    np.testing.assert_allclose(tf_features, features, atol=1e-4, rtol=0)
    weights = read_weights(run / "checkpoints" / "ckpt-000000024")  # and the Google export holds those weights
    exported = read_tensors(str(run / "export" / "google" / "bert_model.ckpt"))
    assert exported.keys() == weights.keys()
    assert all(np.array_equal(exported[name], weights[name]) for name in weights)
