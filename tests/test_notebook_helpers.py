"""The helpers the notebooks call, outside a notebook: parameters, places, runtime set-up, keep-alive."""

import pytest

from tpu_pretrain import notebook
from tpu_pretrain.errors import UserInputError
from tpu_pretrain.notebook import places, runtime_setup
from tpu_pretrain.notebook.params import check_placeholders, parameters
from tpu_pretrain.notebook.steps import settings_flags


def kernel_globals(**values):
    """What a kernel's globals hold after the parameters cell: IPython's names, modules, the parameters."""
    return {"In": [], "Out": {}, "get_ipython": print, "_ih": [], "sys": pytest, **values}


def test_parameters_are_the_cells_literal_assignments_named_once():
    params = parameters(kernel_globals(run_name="bert", num_train_steps=10, learning_rate=1e-4, mirror=False))
    assert params.as_dict() == {"run_name": "bert", "num_train_steps": 10, "learning_rate": 1e-4, "mirror": False}
    assert params.run_name == "bert" and params.get("absent", 3) == 3
    with pytest.raises(AttributeError, match="no parameter 'absent'"):
        _ = params.absent


def test_a_placeholder_is_refused_naming_the_parameter():
    check_placeholders(parameters(kernel_globals(gcs_url="gs://my-bucket/data")))
    with pytest.raises(UserInputError, match=r"gcs_url = 'gs://YOUR_BUCKET/data'.*data_dir = '/kaggle/input/your-data"):
        check_placeholders(parameters(kernel_globals(gcs_url="gs://YOUR_BUCKET/data",
                                                     data_dir="/kaggle/input/your-dataset/data")))


def test_training_settings_become_flags_and_places_are_the_notebooks_to_decide():
    params = parameters(kernel_globals(run_name="bert", model_size="L2-H128", init_checkpoint="", data_dir="gs://x",
                                       dynamic_masking=True, learning_rate=2e-3, top_k=3))
    assert settings_flags(params) == ["--model_size=L2-H128", "--dynamic_masking=true", "--learning_rate=0.002"]


@pytest.mark.parametrize("platform, project, remote", [
    ("colab", places.DRIVE_PROJECT, True),
    ("kaggle", "/kaggle/working/tpu_pretrain", False),
    ("local", "tpu_pretrain", False),
])
def test_the_default_durable_folder_of_each_platform(monkeypatch, platform, project, remote):
    monkeypatch.setattr(places, "runtime", lambda: platform)
    params = parameters(kernel_globals(project_dir="", run_name="r"))
    assert places.project_dir(params) == project
    assert places.is_remote(places.run_mirror(params)) == remote  # Drive: train locally, mirror there


def test_a_drive_path_off_colab_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(runtime_setup, "runtime", lambda: "kaggle")
    with pytest.raises(UserInputError, match="/content/drive, which only exists on Colab.*/kaggle/working"):
        runtime_setup.mount_drive()


def test_a_missing_input_names_the_notebook_that_makes_it(tmp_path):
    with pytest.raises(UserInputError, match="The data of 01 is not at .*Run 01_prepare_data first"):
        places.require(str(tmp_path / "none"), "The data of 01", "01_prepare_data")
    assert places.require(str(tmp_path), "x", "y") == str(tmp_path)


def test_the_keep_alive_is_offered_for_the_console_with_resume_as_the_safeguard():
    text = notebook.keep_alive_instructions(30)
    assert "developer console" in text and "05_resume" in text and "30 * 1000" in text
    assert "colab-connect-button" in notebook.keep_alive_script()


def test_the_training_backend_a_notebook_settles(tmp_path, monkeypatch, capsys):
    from importlib.util import find_spec

    from tpu_pretrain.notebook.runtime_setup import settle_backend
    from tpu_pretrain.runtime import TPU_ENVIRONMENT

    for name in TPU_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert settle_backend("auto", str(tmp_path)) == "auto"  # off a TPU VM the tpu-pretrain process decides
    assert settle_backend("tensorflow", str(tmp_path)) == "tensorflow"
    (tmp_path / "config.json").write_text('{"train": {"backend": "jax"}}')
    assert settle_backend("auto", str(tmp_path)) == "jax"  # a run continues on the backend that started it
    assert "the backend this run was started with" in capsys.readouterr().out
    with pytest.raises(UserInputError, match="was started with jax and continues on it"):
        settle_backend("tensorflow", str(tmp_path))
    (tmp_path / "config.json").write_text('{"train": {}}')  # from before the setting existed
    assert settle_backend("auto", str(tmp_path)) == "tensorflow"
    if find_spec("jax") and find_spec("keras"):  # as on Colab's and Kaggle's TPU images: no tensorflow-tpu here
        monkeypatch.setenv("ISTPUVM", "1")
        assert settle_backend("auto", str(tmp_path / "new_run")) == "jax"
        assert "Backend: jax (a TPU VM" in capsys.readouterr().out
        assert settle_backend("tensorflow", str(tmp_path / "new_run")) == "tensorflow"  # the TPU environment's
    assert settings_flags(parameters(kernel_globals(backend="auto", run_name="x", train_batch_size=8)),
                          backend="jax") == ["--backend=jax", "--train_batch_size=8"]
