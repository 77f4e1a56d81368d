"""A step that does not fit in memory ends with what to change, not a traceback: the real error of a refused
allocation (JAX on the CPU refuses one larger than the machine at once) read as what it is."""

import importlib.util

import pytest

if importlib.util.find_spec("tensorflow") is not None:  # the JAX backend's own tests run once, where JAX runs
    pytest.skip("for the environment without TensorFlow (make test-jax-stack)", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402

from tpu_pretrain.config import Config  # noqa: E402
from tpu_pretrain.core.device_decision import is_out_of_memory, out_of_memory_advice  # noqa: E402


def refused_allocation() -> Exception:
    try:
        jnp.ones((10**12,), jnp.float32).block_until_ready()  # 4 TB
    except Exception as exc:  # noqa: BLE001 - the runtime's own error type is what is under test
        return exc
    pytest.skip("this machine allocated 4 TB")


def test_a_refused_allocation_names_the_settings_that_decide_the_steps_memory():
    exc = refused_allocation()
    assert is_out_of_memory(exc)
    config = Config.load(model_family="modernbert", model_size="base", train_batch_size=256,
                         gradient_accumulation_steps=2, max_seq_length=1024)
    advice = out_of_memory_advice(config, exc)
    assert advice.startswith("The training step does not fit in memory: ModernBERT base at train_batch_size 256 in 2 "
                             "micro-batch(es) of max_seq_length 1024 (RESOURCE_EXHAUSTED: Out of memory allocating "
                             "4000000000000 bytes.)")
    for fix in ("--train_batch_size", "--gradient_accumulation_steps", "--model_size", "tpu-pretrain plan",
                "checkpoints already saved are kept"):
        assert fix in advice


def test_a_full_disk_or_any_other_error_is_not_taken_for_memory():
    assert not is_out_of_memory(OSError(28, "No space left on device"))
    assert not is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Quota exceeded for TPU v5e"))
    assert is_out_of_memory(RuntimeError("OOM when allocating tensor with shape[256,12,1024,1024]"))
