"""Benchmark ``create-data`` end to end: input MB/s, instances/s and peak memory at two corpus sizes.

Usage: python benchmarks/bench_create_data.py CORPUS VOCAB [--scales 1 4] [--workers 0] [--pack_sequences]
       python benchmarks/bench_create_data.py --smoke   (the built-in sample corpus, 60k characters, x1 and x2)

Each size runs ``tpu-pretrain create-data`` (dupe_factor 5, max_seq_length 128, whole-word masking)
in a fresh process tree whose summed RSS is sampled every 20 ms, and reports MB/s, instances/s and the
fill (real tokens / (instances x 128)): MB/s alone hides how many instances, and how much padding, a
corpus makes. The baseline, measured in the same
run, is Hugging Face ``tokenizers`` alone tokenising the same text on all cores: the floor any
pipeline built on it pays. Peak memory grows with shard size until shards exceed one block of work
(2M characters), then stays flat however large the corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import parse_args  # noqa: E402

SMOKE_CHARS = 60_000  # of the built-in sample corpus


def smoke_inputs(folder: Path) -> tuple[Path, str]:
    """The built-in sample corpus (no download) and a small vocab built from it."""
    import tpu_pretrain  # noqa: F401  (environment first)
    from tpu_pretrain.config import Config
    from tpu_pretrain.data.sample_corpus import write_sample_corpus
    from tpu_pretrain.data.vocab import build_vocab

    corpus = write_sample_corpus(folder / "sample.txt", max_chars=SMOKE_CHARS)
    vocab = build_vocab(Config.load(input=[str(corpus)], vocab_size=500, output_dir=str(folder)))
    return corpus, vocab.path


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process] + process.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_create_data(corpus: Path, vocab: str, out: Path, workers: int, pack: bool) -> tuple[float, int, dict]:
    args = [sys.executable, "-m", "tpu_pretrain", "create-data", "--input", str(corpus), "--vocab_file", vocab,
            "--output_dir", str(out), "--dupe_factor", "5", "--max_seq_length", "128",
            "--max_predictions_per_seq", "20", "--do_whole_word_mask", "--workers", str(workers),
            f"--pack_sequences={pack}"]
    start = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watched = psutil.Process(process.pid)
    peak = [0]

    def sample():
        while process.poll() is None:
            try:
                peak[0] = max(peak[0], tree_rss(watched))
            except psutil.NoSuchProcess:
                return
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    seconds = time.perf_counter() - start
    sampler.join()
    if process.returncode:
        raise SystemExit(f"create-data failed:\n{stderr.decode()}")
    manifest = json.loads((out / "manifest.json").read_text())
    return seconds, peak[0], manifest


def tokenizer_only(corpus: Path, vocab: str) -> float:
    """MB/s of the fast tokenizer alone over the same lines (batched, all cores)."""
    import tpu_pretrain  # noqa: F401  (environment first)
    from tpu_pretrain.data.tokenization import load_tokenizer

    tokenizer = load_tokenizer(vocab)
    lines = corpus.read_text(encoding="utf-8").splitlines()
    start = time.perf_counter()
    for i in range(0, len(lines), 10000):
        tokenizer.backend.encode_batch_fast(lines[i:i + 10000], add_special_tokens=False)
    return corpus.stat().st_size / 1e6 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, nargs="?", help="a text corpus (--smoke: the built-in sample)")
    parser.add_argument("vocab", nargs="?", help="its vocab.txt (--smoke: one built from the sample)")
    parser.add_argument("--scales", type=int, nargs="+", default=[2, 16, 64], help="corpus copies per run")
    parser.add_argument("--workers", type=int, default=0, help="0: all cores")
    parser.add_argument("--pack_sequences", action="store_true", help="packed sequences (RoBERTa full sentences)")
    args = parse_args(parser, smoke={"scales": [1, 2]},
                      what=f"the built-in sample corpus ({SMOKE_CHARS:,} characters) x1 and x2, a 500-token vocab")
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke and args.corpus is None:
            args.corpus, args.vocab = smoke_inputs(Path(tmp))
        elif args.corpus is None or args.vocab is None:
            parser.error("give CORPUS and VOCAB (or --smoke)")
        print(f"machine: {os.cpu_count()} cores; corpus {args.corpus} ({args.corpus.stat().st_size / 1e6:.2f} MB)")
        results = []
        for scale in args.scales:
            corpus = Path(tmp) / f"corpus_x{scale}.txt"
            text = args.corpus.read_bytes()
            with open(corpus, "wb") as handle:
                for _ in range(scale):
                    handle.write(text if text.endswith(b"\n") else text + b"\n")
                    handle.write(b"\n")
            size_mb = corpus.stat().st_size / 1e6
            seconds, peak, manifest = run_create_data(corpus, args.vocab, Path(tmp) / f"out_x{scale}", args.workers,
                                                      args.pack_sequences)
            instances = sum(s["instances"] for s in manifest["shards"])
            fill = manifest["totals"]["train"]["fill"]
            results.append((scale, size_mb, seconds, instances, peak))
            print(f"x{scale}: {size_mb:7.2f} MB in {seconds:6.2f} s -> {size_mb / seconds:5.2f} MB/s, "
                  f"{instances / seconds:8.0f} instances/s ({instances} instances, dupe_factor 5, fill {fill:.2f}), "
                  f"peak RSS {peak / 2**20:6.0f} MiB (all processes)")
        baseline = tokenizer_only(Path(tmp) / f"corpus_x{args.scales[0]}.txt", args.vocab)
    best = max(r[1] / r[2] for r in results)
    print(f"baseline, same run: tokenizers alone {baseline:.2f} MB/s; create-data end to end / tokenizer alone = "
          f"{best / baseline:.2f}x")
    first, last = results[-2] if len(results) > 1 else results[0], results[-1]
    print(f"goal: >= 2 MB/s end to end, peak < 1.5 GB and flat once shards exceed one block: peak "
          f"x{last[0]} / x{first[0]} = {last[4] / max(first[4], 1):.2f} for {last[1] / first[1]:.0f}x the text")


if __name__ == "__main__":
    main()
