#!/usr/bin/env bash
# The GPU checks, one prepared run of at most 10 minutes on a machine with an NVIDIA GPU: installs
# the project if it is not yet (or runs under $PYTHON, an interpreter that already has the
# project's packages), then
#  1. bf16 against fp32 through the pipeline's CUDA path: the transfer probe
#     (benchmarks/experiments/arch_probe.py) of params.yaml pretrained and fine-tuned in each
#     precision (benchmarks/experiments/{fp32,bf16}.yaml) at pretraining seeds 42 and 43, the four
#     runs side by side on the one GPU; needs data/pairs, data/tokenizer and data/tasks from a run
#     (skipped without them). Records and logs: $OUT/gpu_probe.tgz;
#  2. benchmarks/checks/gpu_check.py: steps, fits and export, its report in $OUT/gpu_check.json.
# An image with CUDA torch but not the project's packages and no package index needs them on
# PYTHONPATH: one such image lacked pydantic (with pydantic-core, annotated-types,
# typing-inspection), cronsim, seqeval (the probe's entity task) and great_expectations (the fits'
# task preparation). ($OUT: the current folder if unset.) Record the figures in benchmarks/RESULTS.md with the
# device named: `python -m benchmarks.checks.gpu_check --record gpu_check.json`, and
# `python -m benchmarks.experiments.arch_probe --report --workdir DIR ...` on the unpacked records.
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-.}
[ -x "$(command -v "$PYTHON")" ] || make install
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

if [ -d data/pairs/train ] && [ -d data/tasks ]; then
    probe=$(mktemp -d)
    for precision in fp32 bf16; do
        for seed in 42 43; do
            # 4 threads each: the four processes share the host's cores.
            OMP_NUM_THREADS=4 timeout "${PROBE_SECONDS:-330}" "$PYTHON" -m benchmarks.experiments.arch_probe \
                --presets "benchmarks/experiments/$precision.yaml" --seeds "$seed" --workdir "$probe" \
                > "$probe/$precision-s$seed.log" 2>&1 &
        done
    done
    wait
    (cd "$probe" && tar czf - ./*.json ./*.log) > "$OUT/gpu_probe.tgz"
    tail -n 2 "$probe"/*.log
fi

timeout "${CHECK_SECONDS:-260}" "$PYTHON" -m benchmarks.checks.gpu_check --out "$OUT/gpu_check.json" "$@"
cat "$OUT/gpu_check.json"
