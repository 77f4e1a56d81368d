"""What a run does on the devices found (:mod:`tpu_pretrain.core.device_decision`): the decision table of both
backends, pure, from described devices (no TensorFlow, no JAX, no device)."""

from __future__ import annotations

import logging

import pytest

from tpu_pretrain.config import Config
from tpu_pretrain.core.device_decision import (
    FoundDevices,
    decide_devices,
    decide_jit,
    decide_precision,
    decide_steps_per_execution,
)
from tpu_pretrain.core.resolve import RunPlan
from tpu_pretrain.data.data_folder import DataInfo
from tpu_pretrain.errors import UserInputError

TPU = FoundDevices("tpu", 8, bfloat16_native=True)
A100 = FoundDevices("gpu", 2, bfloat16_native=True, float16_capable=True)
T4 = FoundDevices("gpu", 1, float16_capable=True)
P100 = FoundDevices("gpu", 1)
CPU = FoundDevices("cpu", 1)


@pytest.mark.parametrize(("found", "tensorflow", "jax"), [
    (TPU, "bfloat16", "bfloat16"),
    (A100, "float16", "bfloat16"),  # TensorFlow's auto takes float16 wherever there are float16 tensor cores
    (T4, "float16", "float16"),  # the free T4: float32 would run without its tensor cores
    (P100, "float32", "float32"),
    (CPU, "float32", "float32"),
])
def test_auto_precision_by_backend(found, tensorflow, jax):
    assert decide_precision("tensorflow", found)[0] == tensorflow
    assert decide_precision("jax", found)[0] == jax
    for backend in ("tensorflow", "jax"):
        assert decide_precision(backend, found)[1]  # a reason, always
        assert decide_precision(backend, CPU, "bfloat16") == ("bfloat16", "")  # asked for: as asked, nothing said


def test_float16_asked_for_is_refused_on_a_tpu_and_warned_about_where_bfloat16_is_native_by_jax(caplog):
    with pytest.raises(UserInputError, match=r"mixed_precision=float16 on a TPU: TPUs compute bfloat16 natively"):
        decide_precision("jax", TPU, "float16")
    assert decide_precision("tensorflow", TPU, "float16")[0] == "float16"  # the TensorFlow backend never refused it
    with caplog.at_level(logging.WARNING, logger="tpu_pretrain"):
        assert decide_precision("jax", A100, "float16")[0] == "float16"
        assert decide_precision("jax", T4, "float16")[0] == "float16"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("mixed_precision=float16 on GPU, which computes bfloat16 natively")


def test_xla_and_steps_per_call():
    assert [decide_jit("tensorflow", f)[0] for f in (TPU, A100, CPU)] == [True, True, False]
    assert decide_jit("tensorflow", CPU, "on") == (True, "") and decide_jit("tensorflow", TPU, "off") == (False, "")
    assert decide_jit("jax", CPU) == (True, "")  # JAX compiles every step: nothing decided, nothing said
    assert [decide_steps_per_execution(f)[0] for f in (TPU, A100, CPU)] == [100, 20, 1]
    assert decide_steps_per_execution(TPU, 7) == (7, "")


def test_the_eval_batch_and_the_reasons_said_once(caplog):
    data = DataInfo("data", ["train"], ["eval"], 128, 20, eval_instances=50)
    train = Config.load(train_batch_size=64).train
    with caplog.at_level(logging.INFO, logger="tpu_pretrain"):
        decision = decide_devices("tensorflow", FoundDevices("gpu", 4, float16_capable=True), train, data)
    assert (decision.precision, decision.jit_compile, decision.steps_per_execution) == ("float16", True, 20)
    assert decision.eval_batch_size == 48  # the training batch, at most the 50 eval instances, split over 4
    assert [r.getMessage() for r in caplog.records] == list(decision.said) and len(decision.said) == 4
    assert decision.said[0].startswith("mixed_precision=float16: the GPUs have float16 tensor cores")
    assert decision.said[3] == ("eval_batch_size=48: the training batch (64), at most the 50 eval instances, split "
                                "evenly over 4 replicas (set --eval_batch_size to choose).")
    set_by_hand = Config.load(train_batch_size=64, mixed_precision="float32", steps_per_execution=3,
                              eval_batch_size=16).train
    decision = decide_devices("tensorflow", CPU, set_by_hand, data, jit_compile=True)
    assert (decision.precision, decision.jit_compile, decision.steps_per_execution, decision.eval_batch_size) == (
        "float32", True, 3, 16) and decision.said == ()
    assert decide_devices("jax", CPU, train, DataInfo("data", ["train"], [], 128, 20)).eval_batch_size == 0
    with pytest.raises(UserInputError, match=r"train_batch_size=64 must be a multiple of replicas \(3\)"):
        decide_devices("jax", FoundDevices("cpu", 3), train, data)


def test_a_plan_on_its_devices_is_a_new_plan_decided_again_for_another_batch():
    settings = Config.load(model_family="modernbert", model_size="L2-H128", max_seq_length=64,
                           max_predictions_per_seq=20, vocab_size=1000, train_batch_size=32)
    planned = RunPlan.from_settings(settings, backend="jax")
    on_tpu = planned.on_devices("jax", TPU)
    assert planned.devices is None and on_tpu.devices.precision == "bfloat16"
    assert on_tpu.devices.steps_per_execution == 100 and on_tpu.devices.backend == "jax"
    assert on_tpu.on_devices("jax", TPU, precision="float32").devices.precision == "float32"  # fixed by the caller
    wider = on_tpu.with_batch(64, 2)
    assert wider.devices.precision == "bfloat16" and wider.config.train.train_batch_size == 64
    with pytest.raises(UserInputError, match="must be a multiple of replicas"):
        on_tpu.with_batch(8, 2)
