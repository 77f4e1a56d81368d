"""``tpu-pretrain plan``: the training step ``train`` would run, compiled for a TPU that is not here.

JAX describes a TPU slice without owning it (``jax.experimental.topologies``, with libtpu installed: ``pip install
'jax[tpu]'`` works on any Linux x86-64 machine). The real trainer is built on the CPU, its state and input become
shapes sharded over the slice's devices, and the TPU compiler compiles the very step a run's call loops over
(:func:`lower_step`): what it reports (memory per device, FLOPs) is the chip's answer, not an estimate. On a TPU
VM the target ``local`` compiles for the chips present. When the settings do not fit, the largest per-device batch
that does is found by compiling (a line through two compiles predicts it, compiles confirm it), and so is the gradient
accumulation that keeps the asked-for global batch.

One step is compiled, the body of the call's loop (:func:`.step.train_chunk`), not the loop itself: the TPU
compiler reports no temporaries for what runs inside a while loop (0 bytes where the step alone needs 11 MB), and
every step of a call needs the same. The input of ``steps_per_execution`` steps, and the calls' worth the trainer
places ahead, are added to the memory from their shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import tempfile
import time

from ..config import Config
from ..core.peaks import published_peak
from ..core.resolve import RunPlan
from ..core.tpu_targets import GIB, TpuTarget, tpu_target
from ..errors import UserInputError
from .plan_report import Plan, StepCompile, batch_text, describe_run, memory_text

log = logging.getLogger(__name__)

MAX_SEARCH_COMPILES = 6
# The TPU compiler's out-of-memory messages: all buffers together; the temporaries alone; one buffer alone (the last
# two are lower bounds of what the step needs).
_OOM = re.compile(r"Used ([\d.]+)([KMGT]?)i?B? of ([\d.]+)([KMGT]?)i?B? hbm", re.IGNORECASE)
_OOM_TEMPORARIES = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)i?B?\) exceeds available HBM "
                              r"\(([\d.]+)([KMGT]?)i?B?\)", re.IGNORECASE)
_OOM_ONE = re.compile(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
NO_LOCAL_TPU = ("--tpu local: JAX sees no TPU here; name the TPU to plan for (--tpu v5e-1, v5e-8, v6e-1...), or "
                "--tpu cpu to check the settings on this machine's CPU.")


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit.upper()])


def oom_bytes(message: str) -> tuple[int, int] | None:
    """``(needed, capacity)`` from the TPU compiler's out-of-memory messages: "Used 46.93G of 15.75G hbm"; "the total
    memory required for HLO temporaries (167.02G) exceeds available HBM (15.75G)"; "Allocation (size=N) would exceed
    memory (size=M)". The last two count part of the step: it needs at least that."""
    match = _OOM.search(message) or _OOM_TEMPORARIES.search(message)
    if match:
        return _bytes(*match.group(1, 2)), _bytes(*match.group(3, 4))
    match = _OOM_ONE.search(message)
    return (int(match.group(1)), int(match.group(2))) if match else None


@contextlib.contextmanager
def _quiet_stderr():
    """libtpu's start-up warnings about a TPU VM's metadata (harmless without one) kept off the terminal; replayed
    if what they accompanied fails."""
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            os.write(2, sink.read()[-4000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def target_devices(target: TpuTarget | None):
    """The :class:`.devices.Devices` to compile for: a described slice (``target``), or the TPU here (None); the
    precision is the run's plan's to decide (the trainer's)."""
    import jax

    from .devices import Devices, detect_devices

    if target is None:  # the chips here, compiled for from shapes too: nothing is placed on them
        try:
            devices = detect_devices("tpu")
        except UserInputError:  # its advice is train's (--accelerator); plan's is a TPU to name
            devices = None
        if devices is None or devices.kind != "tpu":
            raise UserInputError(NO_LOCAL_TPU)
        return dataclasses.replace(devices, abstract=True)
    try:
        from jax.experimental import topologies

        with _quiet_stderr():
            topology = topologies.get_topology_desc(topology_name=target.topology, platform="tpu",
                                                    chips_per_host_bounds=target.chips_per_host)
    except Exception as exc:  # no libtpu, or one that does not know this chip
        raise UserInputError(
            f"JAX {jax.__version__} cannot describe a {target.name} here ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). Install the TPU compiler beside it: "
            f"pip install 'jax[tpu]=={jax.__version__}' (Linux x86-64; any machine, no TPU needed).") from None
    devices = list(topology.devices)
    release = tuple(int(n) for n in re.findall(r"\d+", _libtpu_version())[:3])
    if release and release < (0, 0, 30):
        log.warning("This TPU compiler (libtpu %s) needs far more host memory and time than newer ones (measured: "
                    "over 18 GB to compile BERT-base with 0.0.23, 3.6 GB with 0.0.50): for large models plan with the "
                    "newest one (pip install -U 'jax[tpu]').", _libtpu_version())
    return Devices("tpu", devices, abstract=True)


def devices_for(tpu: str, target: TpuTarget | None):
    """The devices a plan compiles for: ``cpu``, this host's devices and XLA's CPU compiler (the search's small
    target in tests); else the TPU ``target`` described (:func:`target_devices`), or the TPU here."""
    if tpu == "cpu":
        import jax

        from .devices import Devices

        return Devices("cpu", jax.devices("cpu"), "float32")
    return target_devices(target)


def capacity_of(devices, target: TpuTarget | None) -> int:
    """Bytes one device can hold: a present TPU says so itself, a described one by its published HBM."""
    if target is not None:
        return target.hbm_bytes
    stats = devices.devices[0].memory_stats() or {}
    return int(stats.get("bytes_limit", 0)) or int(16 * GIB)


def compile_step(trainer, batch: int, accumulation: int, capacity: int) -> StepCompile:
    """The trainer's training call (one step) compiled at global ``batch`` with ``accumulation`` micro-batches."""
    trainer.set_batch(batch, accumulation)
    chunk = trainer.chunk_shapes(1)
    input_bytes = sum(s.size * s.dtype.itemsize for s in chunk.values()) // trainer.devices.num_replicas
    start = time.perf_counter()
    try:
        compiled = lower_step(trainer).compile()
    except Exception as exc:  # the compiler's own error, reported as the plan's answer
        message = str(exc).strip()
        needed = oom_bytes(message)
        if needed is None:
            return StepCompile(batch, accumulation, time.perf_counter() - start, capacity,
                               error=_first_lines(message))
        used, compiler_capacity = needed
        # the compiler measured the step without the input the trainer places ahead: add it as for a fitting step
        ahead = input_bytes * _inputs_resident(trainer) - input_bytes
        return StepCompile(batch, accumulation, time.perf_counter() - start, compiler_capacity or capacity,
                           error="out of memory", used=used + ahead)
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    memory = {"state": state_bytes(trainer),
              "input": input_bytes * _inputs_resident(trainer),
              "temporaries": stats.temp_size_in_bytes,
              "output": max(0, stats.output_size_in_bytes - stats.alias_size_in_bytes),
              "program": stats.generated_code_size_in_bytes}
    return StepCompile(batch, accumulation, seconds, capacity, memory=memory, flops=(cost or {}).get("flops"),
                       bytes_accessed=(cost or {}).get("bytes accessed"))


def lower_step(trainer):
    """One step of the trainer's training call (the body its loop runs) lowered from shapes for its devices, its
    state donated and its outputs placed as in the call."""
    import functools

    import jax

    from .step import COPIES, train_step, with_copies

    batch = {name: jax.ShapeDtypeStruct(shape.shape[1:], shape.dtype, sharding=trainer.devices.split(axis=0))
             for name, shape in trainer.chunk_shapes(1).items()}
    replicated, state = trainer.devices.replicated(), trainer.state
    if trainer.spec.carry_copies:  # as the loop's body sees it: the weights' compute-dtype copies with it
        copies = jax.eval_shape(lambda s, b: with_copies(trainer.spec, s, b)[COPIES], state, batch)
        state = {**state, COPIES: [c if c is None else jax.ShapeDtypeStruct(c.shape, c.dtype, sharding=p.sharding)
                                   for c, p in zip(copies, state["params"], strict=True)]}
    step = jax.jit(functools.partial(train_step, trainer.spec), donate_argnums=(0,),
                   out_shardings=(replicated, replicated), **trainer.devices.jit_options())
    return step.lower(state, batch)


def state_bytes(trainer) -> int:
    """One device's share of the training state, from its shapes and shardings. Not the compiler's argument size
    less the input: the compiler drops input the step never reads (an MLM-only model's NSP labels), so that
    difference undercounts the state, and goes below zero at a large batch."""
    import jax

    total = 0
    for leaf in jax.tree.leaves(trainer.state):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += math.prod(shape) * leaf.dtype.itemsize
    return total


def _inputs_resident(trainer) -> int:
    """Batches on a device at once: a call's ``steps_per_execution`` and the calls placed ahead of it."""
    return trainer.steps_per_execution * (1 + trainer.prefetch_chunks)


def _first_lines(message: str, lines: int = 6) -> str:
    kept = [line for line in message.splitlines() if line.strip()][:lines]
    return "\n".join(kept)


def largest_fitting(compile_at, asked: StepCompile, per_device: int, capacity: int) -> StepCompile | None:
    """The largest per-device batch that fits, found by compiling: two compiles give the line that memory follows
    in the batch (weights and optimizer state fixed, activations per sequence), the prediction is compiled, and a
    batch that does not fit moves the search down. ``compile_at(per_device_batch)`` compiles one. None: not even
    one sequence per device fits."""
    grain = 8 if per_device >= 16 else 1
    points = [(per_device, asked.total)]
    best: StepCompile | None = None
    low, high = 0, per_device  # fits at low (0: nothing known), not at high
    candidate = max(1, int(per_device * 0.8 * capacity / asked.total)) if asked.total else 1
    for _ in range(MAX_SEARCH_COMPILES):
        candidate = max(low + 1, min(high - 1, candidate))
        if candidate > grain:
            candidate -= candidate % grain
        if candidate <= low or candidate >= high:
            break
        result = compile_at(candidate)
        if result.error and not result.out_of_memory:
            return result  # not a memory matter: the compiler's error is the answer
        points.append((candidate, result.total))
        if result.fits:
            low, best = candidate, result
        else:
            high = candidate
        candidate = _predicted(points, capacity, low, high, grain)
        if candidate is None:
            break
    return best


def _predicted(points: list[tuple[int, int]], capacity: int, low: int, high: int, grain: int) -> int | None:
    """The batch the line through the two nearest measurements says fills ``capacity``; None when the search is done
    (no whole step of ``grain`` left between what fits and what does not)."""
    if high - low <= grain or high - low <= 1:
        return None
    (b1, m1), (b2, m2) = sorted(points, key=lambda p: abs(p[1] - capacity))[:2]
    if b1 == b2 or m1 == m2:
        return (low + high) // 2
    per = (m1 - m2) / (b1 - b2)
    guess = int(b1 + (capacity - m1) / per) if per > 0 else (low + high) // 2
    if guess <= low or guess >= high:
        guess = (low + high) // 2
    return guess


def check_request(tpu: str, hbm_gib: float = 0.0) -> TpuTarget | None:
    """The described target of ``tpu`` (None: ``local`` or ``cpu``), refusing what no compile can answer: an
    unknown TPU, a memory per device that is not a positive number of GiB (0: the chip's own)."""
    from ..runtime import tpu_chips_present

    if not (math.isfinite(hbm_gib) and hbm_gib >= 0):
        raise UserInputError(f"--hbm_gib {hbm_gib:g}: the memory of one device is a positive number of GiB (16 for "
                             "a v5e chip); leave it out to plan for the chip's published HBM.")
    if tpu == "local" and not tpu_chips_present():
        raise UserInputError(NO_LOCAL_TPU)
    return None if tpu in ("local", "cpu") else tpu_target(tpu)


def backend_notes(config: Config) -> list[str]:
    """What a plan of ``config`` does not describe: the TensorFlow backend trains another program than the JAX
    step compiled here."""
    if config.train.backend != "tensorflow":
        return []
    return ["Note: plan compiles the JAX backend's training step; --backend tensorflow trains with another program "
            "(Keras on TensorFlow), whose memory and speed this plan does not measure. Train with --backend jax to "
            "run the step planned here."]


def plan(config: Config, tpu: str = "v5e-1", search: bool = True, hbm_gib: float = 0.0) -> Plan:
    """Compile ``config``'s training step for ``tpu`` (a target name, ``local``: the TPU here, or ``cpu``: this host's
    devices, with ``hbm_gib``) and, when it does not fit, find what does. ``hbm_gib`` overrides the memory one
    device is taken to hold."""
    import jax

    from .trainer import JaxTrainer

    target = check_request(tpu, hbm_gib)
    devices = devices_for(tpu, target)
    capacity = int(hbm_gib * GIB) if hbm_gib else capacity_of(devices, target)
    run_plan = RunPlan.from_settings(config)
    trainer = JaxTrainer(run_plan.config, devices=devices, plan=run_plan)
    t = trainer.config.train
    batch, k, r = t.train_batch_size, t.gradient_accumulation_steps, devices.num_replicas
    compiles: list[StepCompile] = []

    def compile_at(per_device: int, accumulation: int = k) -> StepCompile:
        result = compile_step(trainer, per_device * r * accumulation, accumulation, capacity)
        compiles.append(result)
        log.info("  compiled %s: %s", batch_text(result, r), memory_text(result))
        return result

    asked = compile_at(batch // (r * k))
    peak = published_peak(getattr(devices.devices[0], "device_kind", ""), trainer.precision)
    result = Plan(target=tpu if target is None else target.describe(), devices=r,
                  hosts=devices.processes,
                  description=describe_run(trainer), precision=trainer.precision, asked=asked,
                  formula_flops=run_plan.training_flops_per_sequence(), peak_flops=peak * r if peak else None,
                  num_train_steps=t.num_train_steps, compiles=compiles,
                  versions=f"jax {jax.__version__}" + ("" if tpu == "cpu" else f", libtpu {_libtpu_version()}"),
                  compiler="XLA's CPU compiler" if tpu == "cpu" else "the TPU compiler", searched=search,
                  notes=backend_notes(config))
    if search and not asked.fits and (asked.out_of_memory or not asked.error):
        result.largest = largest_fitting(compile_at, asked, batch // (r * k), capacity)
        largest = result.largest
        if largest is not None and largest.fits:
            micro = largest.batch // (r * k)
            steps = next((a for a in range(k + 1, batch // r + 1)
                          if batch % (r * a) == 0 and batch // (r * a) <= micro), None)
            if steps is not None:
                result.accumulated = compile_at(batch // (r * steps), steps)
    trainer.close()
    return result


def _libtpu_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return "none"
