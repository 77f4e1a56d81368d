"""What the TPU compiler itself expects a compiled step to take: the cycles its cost model writes on each instruction.

Not a benchmark itself: ``bench_step_variants.py --compile_for v5e-1`` uses it on steps compiled for a TPU on a machine
without one (``pip install 'jax[tpu]'``). The TPU compiler schedules a module by its own cost model and writes that
model's figure on every instruction it costs (``"estimated_cycles"`` in the instruction's backend config: a fusion's
covers its body, a GEMM's its MXU passes, a copy's its relayout). Summed over the instructions that run (the entry
computation, loop bodies, calls and branches: :func:`hlo_roofline.walk`), that is the compiler's own estimate of the
step, in the chip's cycles. What it cannot cost is counted apart: a Pallas kernel (``tpu_custom_call``, the splash
attention kernel among them) carries no figure, so a step with one is estimated without the kernel's time.

The figure is the compiler's model, not a measurement (there is no TPU here); it is for setting variants of one step
against each other under one compiler, as :mod:`hlo_roofline` does for a GPU.
"""

from __future__ import annotations

import re
from collections import defaultdict

from hlo_roofline import model_part, parse, walk

CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
# the start of a line that is an instruction or a computation (or a computation's end, "}" alone): any other line
# continues the last (a Pallas kernel's metadata is written over several lines, the instruction's backend config
# after it)
_LINE_STARTS = ("  %", "  ROOT ", "%", "ENTRY ", "HloModule")


def joined(text: str) -> str:
    """The HLO text with each instruction on one line."""
    lines: list[str] = []
    for line in text.splitlines():
        if lines and line.strip() and line != "}" and not line.startswith(_LINE_STARTS):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return "\n".join(lines)


def step_cycles(text: str) -> dict:
    """The compiler's cycles for one run of the module: in all, by opcode, by part of the model (most first), and
    the kernels it writes no figure on (``unseen_kernels``: Pallas calls, not in the sum)."""
    computations, entry = parse(joined(text))
    by_op: dict[str, int] = defaultdict(int)
    by_part: dict[str, int] = defaultdict(int)
    unseen = 0

    def visit(i, computation: str, launches: int) -> None:
        nonlocal unseen
        found = CYCLES.search(i.attrs)
        if found:
            by_op[i.op] += int(found[1]) * launches
            op_name = re.search(r'op_name="([^"]*)"', i.attrs)
            by_part[model_part(op_name[1]) if op_name else i.op] += int(found[1]) * launches
        elif i.op == "custom-call" and '"tpu_custom_call"' in i.attrs:
            unseen += launches

    walk(computations, entry, visit)
    return {"cycles": sum(by_op.values()), "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
            "by_part": dict(sorted(by_part.items(), key=lambda kv: -kv[1])), "unseen_kernels": unseen}
