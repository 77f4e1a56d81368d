"""What a run does on the devices its backend found: the precision, XLA, the steps per compiled call and the eval
batch, each ``auto`` (or 0) decided once with the reason it logs: the resolver's last decisions
(:meth:`.resolve.RunPlan.on_devices`); and what to change when the step does not fit in their memory.

A backend finds its devices and says what it found (:class:`FoundDevices`); the decisions are made here, the same for
both backends, but for the policies in which they really differ, which are data read by backend name
(:data:`POLICIES`): TensorFlow's ``auto`` trains every GPU with float16 tensor cores in float16, JAX's only those
without native bfloat16 (the free T4), the others in bfloat16.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ..config import Config, TrainConfig
from ..data.data_folder import DataInfo
from ..errors import UserInputError
from ..models.families import family_named

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FoundDevices:
    """What a backend found (or, planning, was described): nothing decided yet."""

    kind: str  # "tpu", "gpu" or "cpu"
    replicas: int  # data-parallel replicas over every process
    bfloat16_native: bool = False  # every device computes bfloat16 natively (TPUs; GPUs of compute capability 8.0+)
    float16_capable: bool = False  # every device is a GPU with float16 tensor cores (compute capability 7.0+)


@dataclass(frozen=True)
class Policy:
    """How one backend's ``auto`` reads what was found: where the backends differ, as data."""

    bfloat16_on: tuple[str, ...]  # kinds that auto trains in bfloat16 where every device computes it natively
    xla_on: tuple[str, ...]  # kinds whose training step jit_compile auto compiles with XLA
    xla_always: bool  # every step is XLA-compiled whatever jit_compile says (the setting is not this backend's)
    float16_checked: bool  # mixed_precision float16 refused on a TPU, warned about where bfloat16 is native


POLICIES = {
    "tensorflow": Policy(bfloat16_on=("tpu",), xla_on=("tpu", "gpu"), xla_always=False, float16_checked=False),
    "jax": Policy(bfloat16_on=("tpu", "gpu"), xla_on=("tpu", "gpu", "cpu"), xla_always=True, float16_checked=True),
}
STEPS_PER_CALL = {"tpu": 100, "gpu": 20}  # steps_per_execution 0, by kind; 1 elsewhere
STEPS_WHY = {"tpu": "host round trips dominate a TPU's short calls",
             "gpu": "a few steps per call spread a GPU's launch overhead"}


@dataclass(frozen=True)
class DeviceDecision:
    """The settings decided on the devices found: what the backends read, and why (``said``)."""

    backend: str  # whose policy decided (:data:`POLICIES`)
    found: FoundDevices
    precision: str  # "float32", "bfloat16" or "float16" (with loss scaling)
    jit_compile: bool
    steps_per_execution: int
    eval_batch_size: int  # global; 0: no evaluation
    said: tuple[str, ...] = ()  # one line per setting decided here ("mixed_precision=bfloat16: ..."), logged once

    def describe(self) -> str:
        return "\n".join(self.said)


def decide_devices(backend: str, found: FoundDevices, train: TrainConfig, data: DataInfo, precision: str | None = None,
                   jit_compile: bool | None = None, say: bool = True) -> DeviceDecision:
    """The settings of ``train`` that the devices decide, for ``backend`` on ``found`` with the data
    ``data``; ``precision``/``jit_compile``: fixed by whoever made the device object (a test, a benchmark, a probe),
    else the settings decide. ``say``: log the reasons (once per run) and the warnings."""
    said: list[str] = []
    if precision is None:
        precision, why = decide_precision(backend, found, train.mixed_precision, warn=say)
        if why:
            said.append(f"mixed_precision={precision}: {why} (set --mixed_precision to choose).")
    if jit_compile is None:
        jit_compile, why = decide_jit(backend, found, train.jit_compile)
        if why:
            said.append(f"jit_compile={'on' if jit_compile else 'off'}: {why} (set --jit_compile to choose).")
    steps, why = decide_steps_per_execution(found, train.steps_per_execution)
    if why:
        said.append(f"steps_per_execution={steps}: {why} (set --steps_per_execution to choose).")
    check_batch_split(train, found.replicas)
    eval_batch = eval_batch_size(train, data, found.replicas, warn=say)
    if not train.eval_batch_size and eval_batch:
        said.append(f"eval_batch_size={eval_batch}: {why_eval_batch(train, data, found.replicas)} (set "
                    "--eval_batch_size to choose).")
    if say:
        for line in said:
            log.info("%s", line)
    return DeviceDecision(backend, found, precision, jit_compile, steps, eval_batch, tuple(said))


def decide_precision(backend: str, found: FoundDevices, requested: str = "auto", warn: bool = True) -> tuple[str, str]:
    """``(precision, why)``: ``requested`` (why empty), or (auto) bfloat16 where the backend takes it and every device
    computes it natively, else float16 on GPUs with float16 tensor cores (loss scaled), else float32."""
    policy = POLICIES[backend]
    if requested != "auto":
        if requested == "float16" and policy.float16_checked:
            check_float16(found, warn)
        return requested, ""
    name = found.kind.upper()
    if found.kind in policy.bfloat16_on and found.bfloat16_native:
        return "bfloat16", f"every {name} device computes bfloat16 natively (no loss scaling, no overflow)"
    if found.kind == "gpu" and found.float16_capable:  # float32 there runs without tensor cores: several times slower
        return "float16", "the GPUs have float16 tensor cores (compute capability 7.0+): float16, with loss scaling"
    if found.kind == "cpu":
        return "float32", "a CPU computes no half precision faster"
    if found.kind == "gpu":
        return "float32", "GPUs without float16 tensor cores (compute capability below 7.0)"
    return "float32", f"{name} devices without native bfloat16"


def check_float16(found: FoundDevices, warn: bool = True) -> None:
    """float16 asked for: refused on a TPU, warned about where every device computes bfloat16 natively."""
    if found.kind == "tpu":
        raise UserInputError("mixed_precision=float16 on a TPU: TPUs compute bfloat16 natively (no loss scaling, no "
                             "overflow). Use --mixed_precision auto (or bfloat16).")
    if found.bfloat16_native and warn:
        log.warning("mixed_precision=float16 on %s, which computes bfloat16 natively: bfloat16 needs no loss "
                    "scaling and cannot overflow (--mixed_precision bfloat16).", found.kind.upper())


def decide_jit(backend: str, found: FoundDevices, requested: str = "auto") -> tuple[bool, str]:
    """``(XLA on, why)``: ``requested`` (why empty), or (auto) on for the kinds the backend compiles."""
    policy = POLICIES[backend]
    if policy.xla_always:
        return True, ""  # nothing to choose: said by the backend's own description
    if requested != "auto":
        return requested == "on", ""
    name = found.kind.upper()
    if found.kind in policy.xla_on:
        return True, f"XLA compiles the training step on a {name}"
    return False, f"a {name} runs the step without XLA"


def decide_steps_per_execution(found: FoundDevices, requested: int = 0) -> tuple[int, str]:
    """``(steps per compiled call, why)``: ``requested``, or (0) many on a TPU, a few on a GPU, 1 elsewhere."""
    if requested:
        return requested, ""
    return STEPS_PER_CALL.get(found.kind, 1), STEPS_WHY.get(found.kind, f"a {found.kind.upper()} gains nothing "
                                                                       "from more steps per call")


def check_batch_split(t: TrainConfig, replicas: int) -> None:
    """The global batch must split evenly over the replicas and the accumulated micro-batches."""
    k = t.gradient_accumulation_steps
    if t.train_batch_size % (replicas * k):
        raise UserInputError(f"train_batch_size={t.train_batch_size} must be a multiple of replicas ({replicas}) x "
                             f"gradient_accumulation_steps ({k}) = {replicas * k}.")


def eval_batch_size(t: TrainConfig, data: DataInfo, replicas: int, warn: bool = True) -> int:
    """The global eval batch: eval_batch_size (or the training batch), at most the eval set, split evenly."""
    if not data.eval_files:
        return 0
    size = t.eval_batch_size or t.train_batch_size
    if data.eval_instances is not None:
        size = min(size, data.eval_instances)
    size -= size % replicas
    if not size and warn:
        log.warning("Too few eval instances (%s) for %s replicas: evaluation is skipped.", data.eval_instances,
                    replicas)
    return size


def why_eval_batch(t: TrainConfig, data: DataInfo, replicas: int) -> str:
    """Why eval_batch_size 0 gave the eval batch it did."""
    why = f"the training batch ({t.train_batch_size})"
    if data.eval_instances is not None and data.eval_instances < t.train_batch_size:
        why += f", at most the {data.eval_instances} eval instances"
    if replicas > 1:
        why += f", split evenly over {replicas} replicas"
    return why


def is_out_of_memory(exc: BaseException) -> bool:
    """The device (or, on a CPU, the machine) refused the step's memory: JAX's ``RESOURCE_EXHAUSTED: Out of memory``,
    TensorFlow's ``OOM when allocating`` (not its ResourceExhaustedError for a full disk)."""
    return bool(re.search(r"out of memory|OOM when allocating", str(exc), re.IGNORECASE))


def out_of_memory_advice(config: Config, exc: BaseException) -> str:
    """What to change when the step does not fit, naming the settings that decide its memory."""
    t, m = config.train, config.model
    model = f"{family_named(m.model_family).title} {m.model_size or 'of ' + (m.bert_config_file or m.init_checkpoint)}"
    first_line = str(exc).strip().splitlines()[0][:200]
    return (f"The training step does not fit in memory: {model} at train_batch_size {t.train_batch_size} in "
            f"{t.gradient_accumulation_steps} micro-batch(es) of max_seq_length {config.data.max_seq_length} "
            f"({first_line}). Lower --train_batch_size, or keep it and raise --gradient_accumulation_steps (the same "
            "batch in smaller micro-batches), or train a smaller --model_size; `tpu-pretrain plan` finds the largest "
            "batch that fits a TPU without one. The checkpoints already saved are kept.")
