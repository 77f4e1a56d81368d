"""The standard TensorFlow build on a machine that looks like a TPU VM: the package sets no TPU variables for it,
and ``tpu-check`` explains TensorFlow's own error. The main suite's (the TPU environment holds the TPU build)."""

import pytest
from tpu_stack_processes import import_tpu_pretrain, tpu_check

from tpu_pretrain import environment

if environment.installed_version("tensorflow-tpu") is not None:
    pytest.skip("for the standard build (the main suite); this environment holds the TPU build",
                allow_module_level=True)


def test_the_standard_build_gets_no_tpu_variables(tmp_path):
    shown = import_tpu_pretrain(tmp_path / "empty", ISTPUVM="1")
    assert not any(shown["env"].values())


def test_tpu_check_with_a_non_tpu_tensorflow_on_a_tpu_vm_explains_the_real_error():
    """ISTPUVM makes this machine look like a TPU VM: the standard build then fails as it does on one."""
    status, out = tpu_check("--backend", "tensorflow", ISTPUVM="1")  # auto would take JAX on a TPU VM
    assert status == 1, out[-3000:]
    assert "No OpKernel was registered to support Op 'ConfigureDistributedTPU'" in out  # TensorFlow's own error
    assert "TPU check FAILED: tensorflow-tpu is not installed in this environment" in out
    assert "The TensorFlow that was loaded is not the TPU build" in out
