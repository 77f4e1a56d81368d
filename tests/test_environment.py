import os
import subprocess
import sys

import pytest

import tpu_pretrain
from tpu_pretrain import environment


def test_import_selects_keras_2_for_tensorflow_and_bert4keras():
    assert os.environ["TF_USE_LEGACY_KERAS"] == "1" and os.environ["TF_KERAS"] == "1"
    code = "import tpu_pretrain, tensorflow as tf; print(tf.keras.layers.Layer.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "TF_KERAS")})
    assert out.stdout.strip().startswith("tf_keras")


def test_tensorflow_already_in_keras_3_mode_is_a_clear_error():
    code = "import tensorflow as tf; tf.keras.layers.Dense; import tpu_pretrain"
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "TF_KERAS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0
    assert "EnvironmentSetupError" in out.stderr and "import tpu_pretrain before tensorflow" in out.stderr


def _fake_versions(monkeypatch, versions):
    def version(name):
        if name not in versions:
            raise environment.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(environment.metadata, "version", version)


def test_wrong_or_missing_bert4keras_names_the_install_command(monkeypatch):
    _fake_versions(monkeypatch, {"tensorflow": "2.21.0", "tf-keras": "2.21.0", "bert4keras": "0.8.1"})
    with pytest.raises(tpu_pretrain.EnvironmentSetupError, match=r"bert4keras 0.8.1 .*--no-deps 'bert4keras==0.11.5'"):
        environment.check_dependencies()
    _fake_versions(monkeypatch, {"tensorflow": "2.21.0", "tf-keras": "2.21.0"})
    with pytest.raises(tpu_pretrain.EnvironmentSetupError, match="bert4keras is missing"):
        environment.check_dependencies()


def test_tf_keras_of_another_minor_version_is_refused(monkeypatch):
    _fake_versions(monkeypatch, {"tensorflow": "2.21.0", "tf-keras": "2.19.0", "bert4keras": "0.11.5"})
    with pytest.raises(tpu_pretrain.EnvironmentSetupError, match=r"tf-keras==2.21"):
        environment.check_dependencies()


def test_installed_environment_passes():
    environment.check_dependencies()
