"""What ``tpu-pretrain plan`` finds (:class:`Plan`, of :class:`StepCompile` each) and prints: the compiled step's
settings, memory per device, what fits instead, FLOPs and the speed an MFU range implies (:func:`report`). Claims
are made only of batches the compiler compiled."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..formatting import hms, human_bytes

MFU_RANGE = (0.25, 0.50)  # Google's BERT-base on a v2-8 reached ~26% of peak, its MLPerf BERT ~50%


@dataclass
class StepCompile:
    """What the compiler said of one training step: its memory per device and FLOPs, or why it did not compile."""

    batch: int  # global train_batch_size
    accumulation: int
    seconds: float
    capacity: int  # bytes one device can hold
    memory: dict[str, int] = field(default_factory=dict)  # per device: state, input, temporaries, output, program
    flops: float | None = None  # XLA's count, per device and step
    bytes_accessed: float | None = None  # XLA's cost model's count of memory traffic, per device and step
    error: str = ""  # the compiler's own message when it did not compile
    used: int | None = None  # an out-of-memory error's bytes needed

    @property
    def total(self) -> int | None:
        return sum(self.memory.values()) if self.memory else self.used

    @property
    def out_of_memory(self) -> bool:
        return self.used is not None

    @property
    def fits(self) -> bool:
        return not self.error and self.total is not None and self.total <= self.capacity


@dataclass
class Plan:
    """The plan of one configuration for one target: the asked-for step, and what fits when it does not."""

    target: str
    devices: int
    hosts: int  # the processes the devices belong to: a pod slice's hosts, each running the same program
    description: str  # the model, shapes and settings compiled
    precision: str
    asked: StepCompile
    formula_flops: float  # the project's training FLOPs per sequence (the MFU numerator)
    peak_flops: float | None  # every device's published peak together
    num_train_steps: int
    largest: StepCompile | None = None  # the largest batch that fits, when the asked one does not
    accumulated: StepCompile | None = None  # the asked-for global batch with gradient accumulation, fitting
    compiles: list[StepCompile] = field(default_factory=list)
    versions: str = ""
    compiler: str = "the TPU compiler"  # which compiler said it: a TPU's, or XLA's CPU compiler (--tpu cpu)
    searched: bool = True  # whether a batch that does not fit was followed by a search (not with --no_search)
    notes: list[str] = field(default_factory=list)  # what the plan does not describe of these settings

    @property
    def fits(self) -> bool:
        return self.asked.fits

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def describe_run(trainer) -> str:
    """The settings the compiled step is made of."""
    d, t, model = trainer.config.data, trainer.config.train, trainer.model_config
    family = trainer.plan.family.title
    heads = ("NSP + " if trainer.with_nsp else "") + "MLM"
    dropout = getattr(model, "hidden_dropout_prob", None)
    if dropout is None:  # ModernBERT's: embeddings, attention and MLP, set together by hidden_dropout_prob
        dropout = max(model.embedding_dropout, model.attention_dropout, model.mlp_dropout)
    return (f"{family} L{model.num_hidden_layers}-H{model.hidden_size} (vocab {model.vocab_size:,}), length "
            f"{d.max_seq_length}, {d.max_predictions_per_seq} predictions, {heads}, {t.optimizer}, dropout "
            f"{dropout:g}, {trainer.steps_per_execution} step(s) per call")


def batch_text(s: StepCompile, devices: int) -> str:
    per = s.batch // devices
    accumulated = f" in {s.accumulation} micro-batches of {per // s.accumulation}" if s.accumulation > 1 else ""
    return f"batch {s.batch:,} ({per:,} per device{accumulated})"


def memory_text(s: StepCompile) -> str:
    if s.error and not s.out_of_memory:
        return "did not compile"
    verdict = "fits" if s.fits else "does NOT fit"
    return f"{human_bytes(s.total)} of {human_bytes(s.capacity)} per device, {verdict} ({s.seconds:.0f} s to compile)"


def report(p: Plan) -> str:
    """The plan as the command prints it."""
    a = p.asked
    lines = [f"Plan for {p.target}: {p.description}; {p.precision}.", *p.notes,
             f"Compiled by {p.compiler} ({p.versions}), not run on a TPU"
             + (": a check of the settings; a TPU's memory and speed differ." if p.target == "cpu" else ".")]
    if a.error and not a.out_of_memory:
        lines.append(f"It does NOT compile for {p.target}: the compiler says\n  " + a.error.replace("\n", "\n  "))
        return "\n".join(lines)
    lines.append(f"Batch: {batch_text(a, p.devices)}.")
    if a.memory:
        m = {name: human_bytes(n) for name, n in a.memory.items()}
        lines.append(f"Memory per device: weights and optimizer state {m['state']}, input {m['input']}, temporaries "
                     f"{m['temporaries']}, program {human_bytes(a.memory['program'] + a.memory['output'])}: total "
                     f"{human_bytes(a.total)} of {human_bytes(a.capacity)}.")
    if a.memory and a.memory["output"] > (1 << 20):  # more than the statistics: the donated state was copied
        lines.append(f"The step's state is NOT updated in place: {human_bytes(a.memory['output'])} of outputs do not "
                     "alias the donated inputs (a bug to report).")
    if a.fits:
        free = a.capacity - a.total
        lines.append(f"FITS, with {human_bytes(free)} ({free / a.capacity:.0%}) to spare.")
    else:
        lines.append(f"Does NOT fit: it needs {human_bytes(a.total)} per device, {human_bytes(a.total - a.capacity)} "
                     f"more than the {human_bytes(a.capacity)} there.")
        lines += _what_fits(p)
    if a.flops:
        per_step = p.formula_flops * a.batch / p.devices
        lines.append(f"FLOPs per device and step: XLA counts {a.flops:.3g}, the formula {per_step:.3g} "
                     f"(XLA/formula {a.flops / per_step:.2f}; MFU uses the formula).")
    if p.peak_flops and a.fits:
        low, high = (m * p.peak_flops / p.formula_flops for m in MFU_RANGE)
        fast, slow = (hms(p.num_train_steps * a.batch / rate) for rate in (high, low))
        lines.append(f"At {MFU_RANGE[0]:.0%}-{MFU_RANGE[1]:.0%} MFU of {p.peak_flops / 1e12:,.0f} TFLOP/s: "
                     f"{low:,.0f}-{high:,.0f} sequences/s; {p.num_train_steps:,} steps in {fast} to {slow} (h:mm:ss).")
    return "\n".join(lines)


def _what_fits(p: Plan) -> list[str]:
    """What fits instead, claimed only of batches compiled: none with --no_search; one sequence per device only
    when the search compiled it."""
    if not p.searched:
        return ["No smaller batch was compiled (--no_search): leave --no_search out to find the largest that fits."]
    if p.largest is None:
        smallest = min(c.batch // p.devices // c.accumulation for c in p.compiles)
        if smallest <= 1:
            return ["Not even one sequence per device fits: choose a smaller model or sequence length, or a TPU with "
                    "more memory per chip."]
        return [f"The search stopped after {len(p.compiles)} compiles without a batch that fits; the smallest "
                f"compiled, {smallest:,} per device, does not: try --train_batch_size {smallest * p.devices // 2:,}."]
    if not p.largest.fits:
        return [f"The search stopped at a compile error: {p.largest.error}"]
    best = p.largest
    lines = [f"The largest batch that fits (compiled): train_batch_size {best.batch:,} "
             f"({best.batch // p.devices:,} per device), {human_bytes(best.total)} of {human_bytes(best.capacity)}."]
    acc = p.accumulated
    if acc is not None and acc.fits:
        lines.append(f"To keep train_batch_size {p.asked.batch:,}: --gradient_accumulation_steps {acc.accumulation} "
                     f"(compiled: {human_bytes(acc.total)} per device).")
    elif acc is not None:
        lines.append(f"train_batch_size {p.asked.batch:,} with --gradient_accumulation_steps {acc.accumulation} does "
                     f"not fit either ({memory_text(acc)}).")
    return lines
