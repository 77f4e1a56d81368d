"""What a compiled GPU step should cost, read from XLA's optimised HLO: each kernel's bytes and FLOPs, and a roofline.

Not a benchmark itself: ``bench_step_variants.py --compile_for h100`` uses it on steps compiled for a GPU on a
machine without one (:mod:`gpu_targets`). Each kernel the step launches (a fusion, a cuBLAS or cuDNN call, a copy;
in the entry computation, in loop bodies times their known trip counts and in command buffers) is read off the
text: the bytes of its operands and results (an operand the fusion only slices counts its slices; a buffer it
updates in place counts the update), the FLOPs of its matrix products, and the part of the model its ``op_name``
names (:func:`device_profile.part_of`). A kernel's time is then the longer of its bytes at the card's rate for
memory-bound kernels and its FLOPs at its matmul rate, plus a launch.

Calibrated on one H100 (2026-11-27, BERT-base, batch 256, jax 0.11.2): its optimised HLO read this way against its
own trace, kernel by kernel (benchmarks/GPU_NOTES.md): the non-matmul kernels ran at a median 2.7 TB/s (80% of the
card's 3.35; quartiles 2.3-3.0, LayerNorm gradients' Triton fusions at about half), the GEMMs at the 707 TFLOP/s
the card measured for the model's shapes; the whole step was estimated at 52.8 ms against the trace's 53.1 ms.
An estimate for comparing variants of one step under one compiler, not a measurement.
"""

from __future__ import annotations

import math
import re
from collections import ChainMap, defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from device_profile import part_of

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5}
ARRAY = re.compile(r"\b(" + "|".join(sorted(DTYPE_BYTES, key=len, reverse=True)) + r")\[([0-9,]*)\]")
INSTRUCTION = re.compile(r"^\s+(ROOT )?%([\w.\-]+) = ")
COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+)")
OPERAND = re.compile(r"%([\w.\-]+)(?:#(\d+))?")  # newer XLA writes a tuple's element inline as %name#index
# what launches nothing: names, tuples, views, control flow (whose bodies are walked instead)
NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
             "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"}


@dataclass(frozen=True)
class Card:
    """The rates a kernel's bytes and FLOPs are turned into time at."""

    name: str
    bandwidth: float  # bytes/s a memory-bound kernel moves
    matmul: float  # FLOP/s of the model's matrix products
    launch: float = 2e-6  # seconds a kernel takes beyond its bytes (the smallest kernels' time in the trace)


CARDS = {
    # measured: the H100 trace's median non-matmul rate and bench_train_jax.py's matmul reading on that card
    "h100": Card("NVIDIA H100 80GB HBM3", 2.7e12, 707e12),
    # the H200's matmul reading (benchmarks/GPU_NOTES.md); its bandwidth the H100's rate scaled by the
    # published 4.8 / 3.35 TB/s: not measured
    "h200": Card("NVIDIA H200", 2.7e12 * 4.8 / 3.35, 695e12),
}
# not measured: the published bandwidth and dense 16-bit peak of each card at the fractions the H100 reached (80%
# and 71.5%); for comparing the compiled steps of one card, and as an order of magnitude for it
_REACHED_BANDWIDTH, _REACHED_MATMUL = 2.7 / 3.35, 707 / 989
for _target, _name, _bandwidth, _matmul in (("a100", "NVIDIA A100-SXM4-40GB", 1555e9, 312e12),
                                            ("l4", "NVIDIA L4", 300e9, 121e12), ("t4", "Tesla T4", 320e9, 65e12)):
    CARDS[_target] = Card(_name, _bandwidth * _REACHED_BANDWIDTH, _matmul * _REACHED_MATMUL)


@dataclass(frozen=True)
class Kernel:
    name: str
    what: str  # the opcode, or the custom call's target (``__cublas$lt$matmul``, ``__cudnn$fmhaSoftmax``...)
    read: int
    written: int
    flops: int
    op_name: str
    launches: int = 1  # per step: its loop's trip count

    @property
    def part(self) -> str:
        return model_part(self.op_name)


def model_part(op_name: str) -> str:
    """The part of the model an instruction's ``op_name`` names (:func:`device_profile.part_of`)."""
    return part_of(op_name.replace("closed_call/", ""))


@dataclass
class _Instruction:
    name: str
    shape: str
    op: str
    operands: list[tuple[str, str]]
    args: str  # the text between the opcode's parentheses (a parameter's number)
    attrs: str  # the text after them
    root: bool

    def called(self, key: str) -> str | None:
        found = re.search(key + r"=%([\w.\-]+)", self.attrs)
        return found[1] if found else None


class Array(NamedTuple):
    dtype: str
    dims: list[int]
    elements: int

    @property
    def bytes(self) -> int:
        return int(self.elements * DTYPE_BYTES[self.dtype])


def arrays(shape: str) -> list[Array]:
    """Every array in a shape (a tuple's elements in order)."""
    found = [(dtype, [int(d) for d in dims.split(",")] if dims else []) for dtype, dims in ARRAY.findall(shape)]
    return [Array(dtype, dims, math.prod(dims)) for dtype, dims in found]


def _closing(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "({[":
            depth += 1
        elif text[i] in ")}]":
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def parse(text: str) -> tuple[dict[str, list[_Instruction]], str]:
    """(instructions by computation, the entry computation's name) of an HLO module's text."""
    computations: dict[str, list[_Instruction]] = {}
    current = entry = None
    for line in text.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            found = COMPUTATION.match(line)
            if found:
                current = found[2]
                computations[current] = []
                entry = current if found[1] else entry
            continue
        found = INSTRUCTION.match(line)
        if not found or current is None:
            continue
        rest = line[found.end():]
        if rest.startswith("("):  # a tuple's shape
            end = _closing(rest, 0)
            shape, rest = rest[:end + 1], rest[end + 1:].lstrip()
        else:
            shape, _, rest = rest.partition(" ")
        op = rest[:rest.index("(")]
        close = _closing(rest, len(op))
        computations[current].append(_Instruction(found[2], shape, op, OPERAND.findall(rest[len(op):close + 1]),
                                                  rest[len(op) + 1:close], rest[close + 1:], bool(found[1])))
    if entry is None:
        raise ValueError("no ENTRY computation in this HLO text")
    return computations, entry


def walk(computations: dict, computation: str, visit, launches: int = 1) -> None:
    """``visit(instruction, computation, launches)`` for each instruction that runs as a kernel of its own, in
    ``computation`` and the loop bodies (times their known trip counts, else once), calls and branches it runs."""
    for i in computations.get(computation, ()):
        if i.op == "while":
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', i.attrs)
            walk(computations, i.called("body"), visit, launches * (int(trips[1]) if trips else 1))
        elif i.op == "call":
            walk(computations, i.called("to_apply"), visit, launches)
        elif i.op == "conditional":
            branches = re.search(r"branch_computations=\{([^}]*)\}", i.attrs)
            for branch in re.findall(r"%([\w.\-]+)", branches[1] if branches else ""):
                walk(computations, branch, visit, launches)
        elif i.op not in NO_KERNEL:
            visit(i, computation, launches)


def kernels(text: str) -> list[Kernel]:
    """The kernels one run of the module launches, with their bytes and FLOPs (see the module's docstring)."""
    computations, entry = parse(text)
    named = {i.name: i for body in computations.values() for i in body}
    found: list[Kernel] = []
    scopes: dict[str, ChainMap] = {}

    def visit(i: _Instruction, computation: str, launches: int) -> None:
        if computation not in scopes:  # its own names first
            scopes[computation] = ChainMap({f.name: f for f in computations[computation]}, named)
        found.append(_kernel(i, computations, scopes[computation], launches))

    walk(computations, entry, visit)
    return found


def _operand_bytes(named: dict, name: str, index: str) -> int:
    source = named.get(name)
    if source is None:
        return 0
    sizes = [a.bytes for a in arrays(source.shape)]
    return (sizes[int(index)] if int(index) < len(sizes) else 0) if index else sum(sizes)


def _kernel(i: _Instruction, computations: dict, named: dict, launches: int) -> Kernel:
    written = sum(a.bytes for a in arrays(i.shape))
    read_instead: dict[int, int] = {}  # operand number -> the bytes the kernel reads of it, where not all
    fused = i.called("calls") if i.op == "fusion" else None
    body = computations.get(fused, []) if fused else []
    if body:
        named = ChainMap({f.name: f for f in body}, named)
        users = defaultdict(list)
        for f in body:
            for operand, _ in f.operands:
                users[operand].append(f)
        for f in body:
            if f.op == "parameter":
                elements = _sliced_elements(f.name, users)
                if elements is not None:
                    read_instead[int(f.args)] = int(elements * DTYPE_BYTES[arrays(f.shape)[0].dtype])
        root = next((f for f in body if f.root), None)
        if root is not None and root.op == "dynamic-update-slice":  # in place: the update is what moves
            update = named.get(root.operands[1][0])
            written = sum(a.bytes for a in arrays(update.shape)) if update else written
            buffer = next((f for f in body if f.name == root.operands[0][0] and f.op == "parameter"), None)
            if buffer is not None:
                read_instead[int(buffer.args)] = 0
    read = sum(read_instead.get(n, _operand_bytes(named, name, index)) for n, (name, index) in enumerate(i.operands))
    target = re.search(r'custom_call_target="([^"]*)"', i.attrs)
    flops = _custom_call_flops(i, target[1], named) if target else sum(_dot_flops(f, named) for f in body)
    op_name = re.search(r'op_name="([^"]*)"', i.attrs)
    return Kernel(i.name, target[1] if target else i.op, read * launches, written * launches, flops * launches,
                  op_name[1] if op_name else "", launches)


def _sliced_elements(name: str, users: dict) -> int | None:
    """The elements a fused computation reads of its value ``name`` when it only slices it (through converts and
    views: XLA reads the slice's elements only); None when it reads all of it."""
    if not users[name]:
        return None
    total = 0
    for u in users[name]:
        if u.op in ("slice", "dynamic-slice") and u.operands[0][0] == name:
            total += sum(a.elements for a in arrays(u.shape))
        elif u.op in ("convert", "bitcast", "reshape") and (below := _sliced_elements(u.name, users)) is not None:
            total += below
        else:
            return None
    return int(total)


def _dot_flops(i: _Instruction, named: dict) -> int:
    """2 x the output's elements x the contracted size, for a dot (in a GEMM fusion)."""
    if i.op != "dot" or i.operands[0][0] not in named:
        return 0
    lhs = arrays(named[i.operands[0][0]].shape)[0].dims
    contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", i.attrs)
    k = math.prod(lhs[int(d)] for d in (contracting[1].split(",") if contracting and contracting[1] else ()))
    return 2 * arrays(i.shape)[0].elements * k


def _custom_call_flops(i: _Instruction, target: str, named: dict) -> int:
    """cuBLAS: 2 x output x contracted size (from its backend config); cuDNN's attention: its two (forward) or
    five (backward, the scores recomputed) ``[S, S]`` products per head."""
    if not i.operands or i.operands[0][0] not in named:
        return 0
    first = arrays(named[i.operands[0][0]].shape)[0].dims
    if "gemm" in target or "matmul" in target:
        contracting = re.search(r'"lhs_contracting_dimensions":\["?(\d+)', i.attrs)
        k = first[int(contracting[1])] if contracting else first[-1]
        return 2 * k * arrays(i.shape)[0].elements
    if "fmha" in target and len(first) == 4:
        batch, length, heads, size = first  # [B, S, H, D], the layout JAX gives cuDNN
        return (10 if "Backward" in target else 4) * batch * heads * length * length * size
    return 0


def estimate(found: list[Kernel], card: Card) -> dict:
    """Milliseconds per step by the roofline (matrix products, everything else), the kernels, the bytes moved, and
    the non-matmul milliseconds by model part, most first."""
    matmul = other = moved = 0.0
    by_part: dict[str, float] = defaultdict(float)
    for k in found:
        seconds = max((k.read + k.written) / card.bandwidth, k.flops / card.matmul) + card.launch * k.launches
        moved += k.read + k.written
        if k.flops:
            matmul += seconds
        else:
            other += seconds
            by_part[k.part] += seconds * 1e3
    return {"ms": (matmul + other) * 1e3, "matmul_ms": matmul * 1e3, "other_ms": other * 1e3,
            "kernels": sum(k.launches for k in found), "gb_moved": moved / 1e9,
            "other_by_part": dict(sorted(by_part.items(), key=lambda kv: -kv[1]))}
