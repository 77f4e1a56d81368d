"""Where a compiled step's device time goes: a ``jax.profiler`` trace's kernels, summed by kind and by model part.

Not a benchmark itself: ``bench_train_jax.py --profile DIR`` uses it. The kernels are read from the Perfetto trace
JAX writes (the device's stream tracks; its other tracks, XLA's ops and modules, repeat their time), and each is
joined to the HLO instruction it runs by name in XLA's dump of the optimised module (a fusion's kernel is named
after it), whose ``op_name`` says the part of the model it computes: ``bwd layer_N/intermediate`` is the feed-forward
layer's activation in the backward pass of every block. A CPU's trace has no device kernels: the summary says so.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import tarfile
from collections import defaultdict
from pathlib import Path

# the kinds of kernel, by marks in their names, tried in this order (cuDNN's attention kernels contain "sm90" too;
# the package's Pallas norms are named after their pallas_call, which no HLO instruction is)
KINDS = (("attention", ("flash", "fmha", "sdpa", "dot_do_o", "dq_to", "attention")),
         ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90", "cublas")), ("layer norm", ("layer_norm",)),
         ("reduction", ("reduce",)), ("scatter", ("scatter",)), ("copy", ("memcpy", "memset", "copy")))
PREFIX = re.compile(r"^jit\([^)]*\)/(?:(?:while/body|eval_jaxpr)/)*")


def dump_flags(folder: Path) -> str:
    """XLA flags that dump the optimised HLO of the training call into ``folder`` (set before JAX starts)."""
    return f"--xla_dump_to={folder} --xla_dump_hlo_module_re=.*train_chunk.*"


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, marks in KINDS if any(m in name for m in marks)), "other")


def trace_file(trace_dir: Path) -> Path | None:
    """The trace ``jax.profiler`` wrote under ``trace_dir`` (or a copy of it named ``trace.json.gz``)."""
    return next(iter(sorted(trace_dir.rglob("*trace.json.gz"))), None)


def optimised_hlo(hlo_dir: Path | None) -> Path | None:
    """XLA's dump of the training call's optimised module in ``hlo_dir``, if any."""
    return next(iter(sorted(hlo_dir.glob("*train_chunk*after_optimizations.txt"))), None) if hlo_dir else None


def trace_events(trace_dir: Path) -> list[dict]:
    """The events of the trace ``jax.profiler`` wrote under ``trace_dir`` (none without one)."""
    path = trace_file(trace_dir)
    if path is None:
        return []
    events = json.loads(gzip.open(path).read())
    return events["traceEvents"] if isinstance(events, dict) else events


def tracks(trace_dir: Path) -> list[dict]:
    """Every track of the trace with events: its process and thread names, events and milliseconds. Said when the
    stream tracks hold no kernels, so that a trace whose kernels landed elsewhere (a CUDA graph's, say) says where."""
    events = trace_events(trace_dir)
    names = {(e["pid"], e.get("tid", "process")): str(e.get("args", {}).get("name", ""))
             for e in events if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")}
    found = defaultdict(lambda: [0, 0.0, defaultdict(int)])
    for e in events:
        if e.get("ph") == "X":
            track = found[(e.get("pid"), e.get("tid"))]
            track[0], track[1] = track[0] + 1, track[1] + e.get("dur", 0) / 1000
            track[2][e.get("name", "")] += 1
    return [{"process": names.get((pid, "process"), str(pid)), "thread": names.get((pid, tid), str(tid)),
             "events": n, "ms": round(ms, 3), "names": [k[:80] for k in sorted(c, key=lambda k: -c[k])[:3]]}
            for (pid, tid), (n, ms, c) in sorted(found.items(), key=lambda kv: -kv[1][1])][:40]


def device_kernels(trace_dir: Path) -> tuple[dict[str, float], dict[str, int]]:
    """(microseconds by kernel name, launches by name) on the device's stream tracks."""
    events = trace_events(trace_dir)
    meta = [e for e in events if e.get("ph") == "M"]
    devices = {e["pid"] for e in meta if e.get("name") == "process_name"
               and "/device:" in str(e.get("args", {}).get("name", ""))}
    streams = {(e["pid"], e.get("tid")) for e in meta if e.get("name") == "thread_name" and e["pid"] in devices
               and "stream" in str(e.get("args", {}).get("name", "")).lower()}
    times, counts = defaultdict(float), defaultdict(int)
    for e in events:
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in streams and "dur" in e:
            times[e["name"]] += e["dur"]
            counts[e["name"]] += 1
    return dict(times), dict(counts)


def model_parts(hlo_dir: Path | None) -> dict[str, str]:
    """Kernel name -> the model part its HLO instruction computes (``fwd``/``bwd``/``step`` and the op's path)."""
    parts, path = {}, optimised_hlo(hlo_dir)
    for line in path.open() if path else ():
        match = re.match(r'\s+%([\w.\-]+) = .*?op_name="([^"]*)"', line)
        if match:
            parts[match[1].replace(".", "_").replace("-", "_")] = part_of(match[2])
    return parts


def part_of(op_name: str) -> str:
    """``jit(train_chunk)/while/body/.../transpose(jvp(layer_3))/attention_norm/reduce_sum`` -> ``bwd
    layer_N/attention_norm``: the pass and the model's first two path names, block numbers folded."""
    path = PREFIX.sub("", op_name)
    stage = "bwd" if "transpose(" in path else "fwd" if "jvp(" in path else "step"
    names = [n for n in re.sub(r"transpose\(|jvp\(|\)", "", path).split("/") if n]
    return f"{stage} {re.sub(r'layer_[0-9]+', 'layer_N', '/'.join(names[:2]))}"


def breakdown(trace_dir: Path, hlo_dir: Path | None, steps: int) -> dict:
    """Per step (ms): by kind, by model part, the 25 longest kernels, and the kernels' total."""
    times, counts = device_kernels(trace_dir)
    if sum(counts.values()) < 20 * steps:  # a step is hundreds of kernels: those of these steps are elsewhere
        return {"note": f"{sum(counts.values())} device kernels on the streams' tracks in {steps} steps (a CPU runs "
                        f"XLA's ops on host threads); the trace's tracks are in 'tracks'", "tracks": tracks(trace_dir)}
    parts = model_parts(hlo_dir)
    kinds, by_part = defaultdict(float), defaultdict(float)
    for name, us in times.items():
        kinds[kind_of(name)] += us / 1000 / steps
        by_part[parts.get(name, f"library {kind_of(name)}")] += us / 1000 / steps
    top = sorted(times.items(), key=lambda kv: -kv[1])[:25]

    def ranked(table):
        return {k: round(v, 3) for k, v in sorted(table.items(), key=lambda kv: -kv[1])}

    return {"ms_per_step": round(sum(times.values()) / 1000 / steps, 3),
            "kernels_per_step": sum(counts.values()) / steps,
            "by_kind": ranked(kinds), "by_part": dict(list(ranked(by_part).items())[:30]),
            "top": [{"kernel": n[:120], "ms_per_step": round(us / 1000 / steps, 3), "per_step": counts[n] / steps,
                     "part": parts.get(n, ""), "kind": kind_of(n)} for n, us in top]}


def keep(trace_dir: Path, hlo_dir: Path | None, out: Path, summary: dict) -> None:
    """``out``: profile.json, the trace and the optimised HLO (the files a GPU session brings back)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(summary, indent=1))
    trace, hlo = trace_file(trace_dir), optimised_hlo(hlo_dir)
    if trace is not None:
        shutil.copy(trace, out / "trace.json.gz")
    if hlo is not None:
        with tarfile.open(out / "hlo.tar.gz", "w:gz") as tar:
            tar.add(hlo, arcname=hlo.name)


def show(summary: dict) -> None:
    if "note" in summary:
        print(f"profile: {summary['note']}")
        for track in summary.get("tracks", [])[:12]:
            print(f"  {track['ms']:10.3f} ms {track['events']:7} events  {track['process']} / {track['thread']}: "
                  f"{', '.join(track['names'])}")
        return
    print(f"profile: {summary['ms_per_step']} ms of device kernels per step ({summary['kernels_per_step']:.0f} "
          f"kernels); by kind (ms per step): {summary['by_kind']}")
    for part, ms in summary["by_part"].items():
        print(f"  {ms:8.3f} ms  {part}")
