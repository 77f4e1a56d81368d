#!/usr/bin/env bash
# One GPU session's measurements for issue 42, prepared on the development machine and run on the lent card in one
# call of the device tool (a session has 15 minutes of device time, a call 10: this takes about 7 and 10 at most).
#
#   bash benchmarks/gpu_session.sh prepare       here: the wheels the card's image lacks (Keras, namex, optree,
#                                                google-crc32c) and the corpus, into .gpu/ (git ignores it)
#   bash benchmarks/gpu_session.sh run           on the card: the device tool's run with carry [".gpu"]
#   bash benchmarks/gpu_session.sh run --smoke   here, on the CPU: every part at smoke size (about 4 minutes)
#   run --with_modernbert                        bench_gpu.py's ModernBERT phases too
#   bash benchmarks/gpu_session.sh probe [--smoke]  on the card (about 6 minutes): the candidates in the step
#                                                (its loop in CUDA graphs, the GELU's gradient and attention as
#                                                Pallas kernels, the norms' fastest tiles), the largest kernels alone
#                                                (bench_kernels_gpu.py), the step traced over one call
#
# The parts, each under its own timeout so that one that runs long costs only itself, everything teed to $OUT:
# 1. bench_step_variants.py: the package against the changes made since the last card, in one process (the same
#    data, seeds and loss): two_sigmoids (the tanh GELU's gradient with two exponentials and two divisions, not one
#    of each), eight_row_partials (the Pallas norms' backward writing partial sums per 8 rows, not per 32),
#    full_last_block (BERT's last block at every position, not only at the rows the loss reads), and six
#    smaller ones undone together (each 0.1-0.3 ms, under the spread of one run): weight_casts (every step casting
#    every weight, where a call carries their bfloat16 copies), gemm_biases (the dense layers' biases before the
#    norms added by their GEMMs, their gradients XLA's reductions), norm_sums_apart (the global norm a reduction per
#    large gradient), loss_passes_apart (the MLM loss and accuracy reading the logits three times, not once),
#    vocab_logits (the logits as wide as the vocabulary, their gradient then padded by a copy), norm_partials_apart
#    (each norm's partial gradients a reduction each); benchmarks/GPU_NOTES.md has what each was predicted to move.
# 2. bench_gpu.py: the step, the command's steady rate, both PyTorch peers (ModernBERT at 1,024, whose goal two
#    cards met, left out for time: `run --with_modernbert` keeps it, past a call's 10 minutes if all runs long).
# 3. bench_step_numerics.py (about 60 s and 30 s, in the time left): the step's loss, gradients (rows whole, and
#    padded with documents apart) and two steps' updates on the card (BERT-base as timed; a small ModernBERT at
#    1,024) against the card's CPU in float32, beside the CPU's own bfloat16 step, from the same weights. The GPU's forms of the step (cuDNN's
#    attention, the Pallas norms, the carried copies, the widened bias sums...) are each checked against their
#    generic forms on a CPU by the tests; the step assembled from them runs only on a card.
set -uo pipefail
cd "$(dirname "$0")/.."
GPU=.gpu

prepare() {
    mkdir -p "$GPU/whl"
    grep -qx "/$GPU/" .git/info/exclude 2>/dev/null || echo "/$GPU/" >> .git/info/exclude
    # the versions the project's JAX environment has, as wheels for the card's Python 3.12 on x86-64
    local python=${PYTHON:-.venv-jax/bin/python}
    local wants
    wants=$("$python" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in ("keras", "namex", "optree", "google-crc32c")))
EOF
) || { echo "no $python with Keras: make install-jax-stack first" >&2; exit 1; }
    rm -f "$GPU"/whl/*.whl
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$GPU/whl" $wants || exit 1
    cp ../shared/corpora/wikitext2_valid.txt "$GPU/" || exit 1
    ls -l "$GPU" "$GPU/whl"
    echo "ready: run 'bash benchmarks/gpu_session.sh run' on the card, carrying $GPU"
}

begin() {  # begin SMOKE: $OUT, the environment; on the card (SMOKE empty) the carried wheels and the card's names
    OUT=${OUT:-$(mktemp -d)}
    export PYTHONUNBUFFERED=1 KERAS_BACKEND=jax PYTHONPATH=$PWD
    [ -n "$1" ] && return
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$GPU"/whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/card.txt"
    python3 -c "import jax, keras, torch, transformers; print('jax', jax.__version__, 'keras', keras.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__, jax.devices())" | tee -a "$OUT/card.txt"
}

part() {  # part NAME SECONDS COMMAND...: one part under its timeout, its output teed to $OUT/NAME.log
    local name=$1 seconds=$2
    shift 2
    echo "== $name (at most ${seconds} s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s"
}

part_in_time_left() {  # part_in_time_left NAME COMMAND...: a part under what is left of a call's 600 s (at most 120)
    local left=$((585 - SECONDS))
    [ "$left" -gt 120 ] && left=120
    local name=$1
    shift
    if [ "$left" -ge 30 ]; then
        part "$name" "$left" "$@"
    else
        echo "== $name: skipped, ${left} s left of the call"
    fi
}

run() {
    # bench_gpu.py's budget: it gives each phase its share and skips one whose share falls under its floor (the
    # step's 50 s): the four phases fit in 320 s, all six in its default 420
    local smoke="" skip=(--skip modernbert_hf modernbert_jax) budget=320
    for arg in "$@"; do
        case $arg in
            --smoke) smoke=--smoke ;;
            --with_modernbert) skip=() budget=420 ;;
            *) echo "run: unknown option $arg" >&2; exit 2 ;;
        esac
    done
    begin "$smoke"
    if [ -z "$smoke" ]; then
        local python=python3 corpus=$GPU/wikitext2_valid.txt steps=(--steps 100 --rounds 5)
    else
        local python=${PYTHON:-.venv-jax/bin/python} corpus=../shared/corpora/wikitext2_valid.txt steps=(--smoke)
    fi
    part variants 230 "$python" benchmarks/bench_step_variants.py "${steps[@]}" \
        --variants base two_sigmoids eight_row_partials full_last_block \
        weight_casts+gemm_biases+norm_sums_apart+loss_passes_apart+vocab_logits+norm_partials_apart
    part bench_gpu $((budget + 25)) "$python" benchmarks/bench_gpu.py $smoke "${skip[@]}" --corpus "$corpus" \
        --json "$OUT/bench_gpu.json" --budget_s "$budget"
    # the device tool brings back at most 8 files of 16 MiB, none deeper than two folders: the logs' folder as one
    # archive, without the step's trace (its summary is in bench_gpu.json; `probe` brings a trace back); a smoke run
    # keeps its logs in its own work folder
    [ -d "$OUT/bench_gpu_logs" ] && tar -czf "$OUT/bench_gpu_logs.tgz" --exclude=trace.json.gz -C "$OUT" \
        bench_gpu_logs && rm -rf "$OUT/bench_gpu_logs"
    # last, in what is left of a call's 600 s (the figures above are what the call is for): BERT-base's step as
    # timed, and a small ModernBERT at 1,024 (its local and global attention, documents apart as the command has them)
    local modern=()
    [ -z "$smoke" ] && modern=(--model_size L6-H256 --seq 1024 --pred 150 --batch 4)
    part_in_time_left numerics_bert "$python" benchmarks/bench_step_numerics.py $smoke
    part_in_time_left numerics_modernbert "$python" benchmarks/bench_step_numerics.py $smoke \
        --model_family modernbert "${modern[@]}"
    echo "== done: $OUT"
}

fastest() {  # fastest PREFIX [WHAT]: the integers after PREFIX in the name of kernels.json's fastest row named
    # PREFIX... (and measuring WHAT), joined by commas: a tile shape as support.kernel_tiles reads it
    "$python" - "$OUT/kernels.json" "$@" <<'EOF' 2>/dev/null
import json, re, sys
prefix, what = sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
rows = [r for r in json.load(open(sys.argv[1]))["rows"]
        if r["name"].startswith(prefix) and "ms" in r and what in (None, r["what"])]
print(",".join(re.findall(r"\d+", min(rows, key=lambda r: r["ms"])["name"][len(prefix):])) if rows else "")
EOF
}

probe() {
    # the step's largest kernels alone (bench_kernels_gpu.py: the Pallas norm's tiles, the GELU's gradient in XLA's
    # two forms and as pallas_gelu.py's kernel, attention by cuDNN and by pallas_short_attention.py, each candidate at
    # five tile shapes); the candidates in the step against the package's, the kernels at their fastest tiles alone:
    # bench_step_variants's while_graphs (the whole loop in CUDA graphs), pallas_gelu (the GELU's gradient with its
    # bias's as one Pallas kernel), short_attention (attention at 128 as two Pallas kernels, the backward one) and,
    # where the norm's fastest tiles are not the package's, norm_tiles; the step traced over one timed call: about 6
    # minutes, 8.5 at most (a part cut short by its timeout costs only its own figures)
    local smoke=""
    for arg in "$@"; do
        case $arg in
            --smoke) smoke=--smoke ;;
            *) echo "probe: unknown option $arg" >&2; exit 2 ;;
        esac
    done
    begin "$smoke"
    if [ -z "$smoke" ]; then
        local python=python3 step=(--model_size base --batch 256 --steps 20 --steps_per_execution 20)
        local variant_steps=(--steps 100 --rounds 5)
    else
        local python=${PYTHON:-.venv-jax/bin/python} step=(--smoke) variant_steps=(--smoke)
    fi
    part kernels 120 "$python" benchmarks/bench_kernels_gpu.py $smoke --json "$OUT/kernels.json"
    PALLAS_GELU_TILES=$(fastest gelu_gradient_pallas_) SHORT_ATTENTION_TILES=$(fastest attention_short_)
    LAYER_NORM_TILES=$(fastest layer_norm_ forward+backward)
    echo "== the candidates' tiles, fastest alone: PALLAS_GELU_TILES=$PALLAS_GELU_TILES" \
        "SHORT_ATTENTION_TILES=$SHORT_ATTENTION_TILES LAYER_NORM_TILES=$LAYER_NORM_TILES (empty: the modules' own)"
    export PALLAS_GELU_TILES SHORT_ATTENTION_TILES LAYER_NORM_TILES
    # the norms at their fastest tiles only where those are not the package's
    local norm_tiles="" package
    package=$("$python" -c 'from tpu_pretrain.jax_backend.gpu_layer_norm import ROWS, BACKWARD_TILES, WARPS
print(f"{ROWS},{BACKWARD_TILES},{WARPS}")')
    [ -n "$LAYER_NORM_TILES" ] && [ "$LAYER_NORM_TILES" != "$package" ] && norm_tiles=norm_tiles
    part candidates 270 "$python" benchmarks/bench_step_variants.py "${variant_steps[@]}" \
        --variants base while_graphs pallas_gelu short_attention $norm_tiles
    part profile 110 "$python" benchmarks/bench_train_jax.py "${step[@]}" --profile "$OUT/profile"
    # the trace itself only where it fits what the device tool brings back (16 MiB a file)
    find "$OUT/profile" -name trace.json.gz -size +15M -delete 2>/dev/null
    echo "== done: $OUT"
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    probe) shift; probe "$@" ;;
    *) echo "usage: bash benchmarks/gpu_session.sh prepare | run [--smoke] [--with_modernbert] | probe [--smoke]" >&2
       exit 2 ;;
esac
