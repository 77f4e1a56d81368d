"""Upload/download throughput against gcp-storage-emulator, with 1 and N parallel transfers.

    .venv/bin/python benchmarks/bench_storage.py [--workers 8] [--small 200] [--large-mb 64]
                                                 [--latency-ms 0] [--smoke]

Two workloads: many small files (where per-request latency dominates and parallel transfers pay)
and one large file (with N workers it moves as parallel slices: a composite upload of parts and
ranged downloads, ``--slice-mb`` each; with 1 worker as one resumable stream of 8 MiB chunks).
The emulator is a single-threaded server on loopback with no network latency and no per-stream limit,
so it understates what parallelism gains against real Cloud Storage (where one stream tops out well
below a VM's bandwidth); ``--latency-ms`` and ``--stream-mib-s`` put a proxy in front that adds that
delay to every request and caps each request's throughput, modelling a real bucket. ``--smoke``: a few
small files and a 2 MiB file in 512 KiB slices (seconds; meaningless figures).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from storage_emulator import DenyingProxy, Emulator  # noqa: E402
from support import parse_args  # noqa: E402

from tpu_pretrain.storage import auth  # noqa: E402
from tpu_pretrain.storage.transfer import TransferOptions, transfer  # noqa: E402

MiB = 1024 * 1024


def run(src: str, dst: str, workers: int, slice_mb: float = 8) -> tuple[float, int]:
    options = TransferOptions(workers=workers, progress=False, retries=0, parallel_threshold=int(2 * slice_mb * MiB),
                              slice_size=int(slice_mb * MiB))
    summary = transfer(src, dst, options)
    if not summary.ok or summary.skipped:
        raise SystemExit(summary.text())
    return summary.seconds, sum(r.size for r in summary.sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--small", type=int, default=200, help="number of small files")
    parser.add_argument("--small-kb", type=int, default=64)
    parser.add_argument("--large-mb", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--slice-mb", type=float, default=8, help="slice size of a parallel large-file transfer")
    parser.add_argument("--stream-mib-s", type=float, default=0.0,
                        help="cap each request at this many MiB/s (a real bucket's per-stream limit); 0: none")
    args = parse_args(parser, smoke={"workers": 4, "small": 8, "small_kb": 16, "large_mb": 2, "slice_mb": 0.5},
                      what="8 files of 16 KiB, one of 2 MiB in 512 KiB slices")

    tmp = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    emu = Emulator(tmp / "emu").start()
    proxy = (DenyingProxy(emu.url, latency=args.latency_ms / 1000, stream_bytes_per_second=args.stream_mib_s * MiB)
             if args.latency_ms or args.stream_mib_s else None)
    try:
        if proxy:
            proxy.__enter__()
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.url if proxy else emu.url
        os.environ["TPU_PRETRAIN_CACHE_DIR"] = str(tmp / "cache")
        auth.reset()
        auth.storage_client(workers=args.workers).create_bucket("bench")
        small = tmp / "small"
        small.mkdir()
        for i in range(args.small):
            (small / f"shard-{i:05d}.bin").write_bytes(os.urandom(args.small_kb * 1024))
        large = tmp / "large"
        large.mkdir()
        (large / "model.bin").write_bytes(os.urandom(args.large_mb * MiB))

        where = (f"emulator + proxy: {args.latency_ms:g} ms/request, {args.stream_mib_s:g} MiB/s per stream"
                 if proxy else "emulator on loopback")
        print(f"Cloud Storage transfer throughput ({where}; {os.cpu_count()} CPUs)")
        print(f"{'workload':<28}{'direction':<10}{'1 worker':>12}{f'{args.workers} workers':>12}{'ratio':>8}")
        workloads = [(f"{args.small} x {args.small_kb} KiB files", small),
                     (f"1 x {args.large_mb} MiB file", large)]
        for label, folder in workloads:
            for direction in ("upload", "download"):
                rates = []
                for workers in (1, args.workers):
                    prefix = f"gs://bench/{folder.name}-{workers}"
                    if direction == "upload":
                        seconds, size = run(str(folder), prefix, workers, args.slice_mb)
                    else:
                        out = tmp / f"down-{folder.name}-{workers}"
                        seconds, size = run(prefix, str(out), workers, args.slice_mb)
                        shutil.rmtree(out)
                    rates.append(size / MiB / seconds)
                print(f"{label:<28}{direction:<10}{rates[0]:>9.1f} MiB/s{rates[1]:>7.1f} MiB/s"
                      f"{rates[1] / rates[0]:>7.2f}x")
    finally:
        if proxy:
            proxy.__exit__()
        emu.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
