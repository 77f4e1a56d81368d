"""Model FLOPs utilisation (MFU): the accelerators' published dense peaks, and the formula.

One table for the training log line and the benchmarks. A device is named as its framework names it: JAX's
``device_kind`` ("TPU v5 lite", "NVIDIA H100 80GB HBM3", "Tesla T4"), TensorFlow's GPU ``device_name``, or a
TPU VM's accelerator type ("v5litepod-8", "v3-8"). The peaks are per device as both frameworks count devices
(a TPU v2 or v3 *core*, one chip of the others), so a data-parallel group's peak is one device's times the
number of replicas. MFU = sequences/s x training FLOPs per sequence
(:func:`..models.bert_config.training_flops_per_sequence`) / peak FLOP/s.
"""

from __future__ import annotations

import re

# Published dense peaks per device, TFLOP/s: (bfloat16 or float16, float32 or TF32 as XLA uses it). The first
# pattern found in the device's name wins, so a more specific name comes before a shorter one it contains.
PEAKS = {"H200": (989.0, 494.0), "H100": (989.0, 494.0), "A100": (312.0, 156.0), "L4": (121.0, 60.0),
         "A10G": (70.0, 35.0), "V100": (125.0, 15.7), "T4": (65.0, 8.1), "P100": (18.7, 9.3),
         "TPU v6 lite": (918.0, 918.0), "TPU v5 lite": (197.0, 197.0), "TPU v5p": (459.0, 459.0),
         "TPU v4": (275.0, 275.0), "TPU v3": (61.5, 61.5), "TPU v2": (22.5, 22.5)}
# How each name is recognised: JAX's device kind, and a TPU VM's accelerator type (v5litepod-8, v5p-8, ...).
_PATTERNS = {"TPU v6 lite": r"\bv6(e|\s*lite)", "TPU v5 lite": r"\bv5(e\b|\s*lite)", "TPU v5p": r"\bv5p?\b",
             "TPU v4": r"(^|TPU\s*)v4\b", "TPU v3": r"(^|TPU\s*)v3\b", "TPU v2": r"(^|TPU\s*)v2\b"}


def published_peak(device_name: str, precision: str) -> float | None:
    """One device's dense peak in FLOP/s computing in ``precision`` (float32, bfloat16 or float16); None when
    the table does not know ``device_name``."""
    for name, (low, full) in PEAKS.items():
        if re.search(_PATTERNS.get(name, rf"\b{name}\b"), device_name or "", re.IGNORECASE):
            return 1e12 * (full if precision == "float32" else low)
    return None


def group_peak(device_name: str, precision: str, devices: int) -> float | None:
    """The peak FLOP/s of ``devices`` such devices training together; None when unknown."""
    peak = published_peak(device_name, precision)
    return peak * devices if peak is not None else None


def mfu(sequences_per_second: float, flops_per_sequence: float, peak_flops: float | None) -> float | None:
    """The share of the peak the model's training FLOPs use; None without a peak."""
    return sequences_per_second * flops_per_sequence / peak_flops if peak_flops else None


def overstated_peak(value: float, peak_flops: float, stated_tflops: float, devices: str) -> str:
    """What an MFU over 100% says: devices cannot beat their own peak, so the peak measured against is wrong."""
    which = f"the stated --peak_tflops {stated_tflops:g}" if stated_tflops else "the published peak"
    return (f"MFU {value:.0%} is over 100%: {devices} just did more than {which} ({peak_flops / 1e12:.3g} TFLOP/s), so "
            "that peak is wrong and so is every MFU figure of this run. Set --peak_tflops to the devices' real dense "
            "peak" + (" (or leave it unset for the published one)." if stated_tflops else "."))
