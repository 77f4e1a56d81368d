"""Which training backend a runtime gets, and a run that stays on the backend that started it."""

import pytest

from tpu_pretrain import backend
from tpu_pretrain.config import Config
from tpu_pretrain.core.run_folder import RunFolder, run_identity
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.models.bert_config import bert_config_for_size


def fake_runtime(monkeypatch, installed: dict, tpu_vm: bool):
    monkeypatch.setattr(backend, "installed_version", lambda *names: next(
        (installed[n] for n in names if n in installed), None))
    monkeypatch.setattr(backend, "tpu_vm_present", lambda: tpu_vm)


FULL_TF = {"tensorflow": "2.21.0", "tf-keras": "2.21.0", "bert4keras": "0.11.5"}
JAX = {"jax": "0.10.2", "keras": "3.15.1"}


@pytest.mark.parametrize("installed,tpu_vm,expected", [
    ({**FULL_TF, **JAX}, False, "tensorflow"),  # a GPU/CPU machine with both: the first path
    ({**JAX}, True, "jax"),  # Colab's TPU image: JAX, no TensorFlow
    ({"tensorflow-cpu": "2.20.0", "tf-keras": "2.20.0", **JAX}, True, "jax"),  # Kaggle's: TF cannot see the TPU
    ({"tensorflow-tpu": "2.19.1", "tf-keras": "2.19.0", "bert4keras": "0.11.5", **JAX}, True, "tensorflow"),
    ({**JAX}, False, "jax"),  # no TensorFlow anywhere
])
def test_auto_picks_jax_where_tensorflow_cannot_use_the_machine(monkeypatch, installed, tpu_vm, expected):
    fake_runtime(monkeypatch, installed, tpu_vm)
    chosen, why = backend.choose_backend("auto")
    assert chosen == expected and why


def test_an_explicit_backend_that_is_not_installed_names_the_fix(monkeypatch):
    fake_runtime(monkeypatch, FULL_TF, False)
    with pytest.raises(UserInputError, match=r"tpu_pretrain\[jax\]"):
        backend.choose_backend("jax")
    fake_runtime(monkeypatch, JAX, False)
    with pytest.raises(UserInputError, match="--backend jax"):
        backend.choose_backend("tensorflow")


def test_a_run_resumes_only_on_the_backend_that_started_it(tmp_path):
    class Data:
        train_instances, train_files, vocab_sha256 = 10, ["train-00000-of-00001.tfrecord"], None

    bert = bert_config_for_size("L2-H128", 100)
    run = RunFolder(tmp_path)
    run.record_identity(run_identity(Config.load(backend="tensorflow"), bert, Data()))
    run.check_can_resume(run_identity(Config.load(backend="tensorflow"), bert, Data()))
    with pytest.raises(UserInputError, match="backend: 'tensorflow' in the run, 'jax' now"):
        run.check_can_resume(run_identity(Config.load(backend="jax"), bert, Data()))
    legacy = run.identity_file.read_text().replace('"backend": "tensorflow",', "")  # a run from before the setting
    assert legacy != run.identity_file.read_text()
    run.identity_file.write_text(legacy)
    run.check_can_resume(run_identity(Config.load(backend="tensorflow"), bert, Data()))
    with pytest.raises(UserInputError, match="backend: 'tensorflow' in the run, 'jax' now"):
        run.check_can_resume(run_identity(Config.load(backend="jax"), bert, Data()))


def test_a_setting_the_backend_does_not_offer_is_refused_before_any_data_is_read(tmp_path):
    """Several machines (``worker_hosts``) are the TensorFlow backend's alone: refused for JAX, naming both."""
    from tpu_pretrain.training import train

    missing = tmp_path / "no_data_here"  # read first, it would fail on the missing data folder instead
    with pytest.raises(UserInputError, match=r"worker_hosts='10.0.0.1:2222,10.0.0.2:2222' .* offered by the "
                                             r"tensorflow backend, not jax: train with --backend tensorflow"):
        train(data_dir=str(missing), output_dir=str(tmp_path / "run"), backend="jax",
              worker_hosts="10.0.0.1:2222,10.0.0.2:2222", task_index=0)
    assert not missing.exists()


def test_document_masks_on_the_tensorflow_backend_are_refused_with_the_reason(tmp_path, capsys):
    """The TensorFlow backend's attention has no document masks: ``on`` is refused before any data is read (it would
    train without them and record "on"); ``auto`` and ``off`` train as they are."""
    from tpu_pretrain.cli import main

    missing = tmp_path / "no_data_here"
    assert main(["train", "--backend", "tensorflow", "--document_masks", "on", "--data_dir", str(missing),
                 "--output_dir", str(tmp_path / "run"), "--model_size", "L2-H128"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert ("document_masks='on' (the documents of packed rows kept apart; the TensorFlow backend's attention has no "
            "document masks) is offered by the jax backend, not tensorflow: train with --backend jax, or leave "
            "document_masks unset") in said, said
    assert not missing.exists() and not (tmp_path / "run").exists()
    for mode in ("auto", "off"):
        backend.check_offered("tensorflow", Config.load(document_masks=mode))
    backend.check_offered("jax", Config.load(document_masks="on"))


@pytest.mark.parametrize("setting,value", [("lr_schedule", "wsd"), ("dynamic_masking", True),
                                           ("mixed_precision", "float16")])
def test_both_backends_offer_wsd_dynamic_masking_and_float16(setting, value):
    """Once the TensorFlow backend's alone; the JAX backend trains them too (tests/jax_backend)."""
    settings = Config.load(**{setting: value}).train
    for name in backend.BACKENDS:
        backend.check_offered(name, settings)


def test_neither_backend_installed_names_extras_that_exist(monkeypatch):
    import configparser
    import re
    from pathlib import Path

    fake_runtime(monkeypatch, {}, False)
    with pytest.raises(UserInputError) as caught:
        backend.choose_backend("auto")
    setup = configparser.ConfigParser()
    setup.read(Path(__file__).parents[1] / "setup.cfg")
    extras = set(setup["options.extras_require"])
    named = re.findall(r"tpu_pretrain\[(\w+)\]", str(caught.value))
    assert named and set(named) <= extras, (named, extras)
    assert "bert4keras==0.11.5" in str(caught.value)


def test_a_setting_a_recipe_made_is_blamed_on_the_recipe():
    """A refused setting names who set it: the recipe (override it) or the user (leave it unset)."""
    settings = Config.load(jit_compile="off").train
    with pytest.raises(UserInputError) as caught:
        backend.check_offered("jax", settings, set_by={"jit_compile": "--recipe some_recipe"})
    message = " ".join(str(caught.value).split())
    assert "jit_compile='off' (training without XLA, set by --recipe some_recipe)" in message
    assert "or give --jit_compile another value (it wins over the recipe)" in message
    with pytest.raises(UserInputError) as caught:
        backend.check_offered("jax", settings)
    assert "set by" not in str(caught.value) and "or leave jit_compile unset" in str(caught.value)


def test_modernbert_is_the_jax_backends_alone_and_auto_takes_jax_for_it(monkeypatch, tmp_path):
    """Refused on TensorFlow before any data is read (even where TensorFlow is installed); ``auto`` picks JAX for
    it on a machine where it would otherwise take TensorFlow."""
    from tpu_pretrain.training import train

    fake_runtime(monkeypatch, {**FULL_TF, **JAX}, False)
    modern = Config.load(model_family="modernbert")
    chosen, why = backend.run_backend("auto", None, modern)
    assert chosen == "jax" and "model_family='modernbert' (ModernBERT) is offered by it alone" in why
    assert backend.run_backend("auto", None, Config.load())[0] == "tensorflow"
    fake_runtime(monkeypatch, {"tensorflow-cpu": "2.20.0", "tf-keras": "2.20.0", **JAX}, True)  # Kaggle's TPU VM
    assert backend.run_backend("auto", None, Config.load(jit_compile="off"))[0] == "jax"  # the machine decides
    fake_runtime(monkeypatch, {**FULL_TF, **JAX}, False)
    backend.check_offered("jax", modern)
    backend.check_offered("tensorflow", modern.train)  # a section without the setting: nothing asked of it
    missing = tmp_path / "no_data_here"
    with pytest.raises(UserInputError, match=r"model_family='modernbert' \(ModernBERT\) is offered by the jax backend, "
                                             r"not tensorflow: train with --backend jax, or leave model_family unset"):
        train(data_dir=str(missing), output_dir=str(tmp_path / "run"), backend="tensorflow", model_family="modernbert")
    assert not missing.exists()
