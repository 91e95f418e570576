#!/usr/bin/env bash
# The GPU check (benchmarks/checks/gpu_check.py), one prepared run of at most 8 minutes on a
# machine with an NVIDIA GPU: installs the project if it is not yet (or runs under $PYTHON, an
# interpreter that already has the project's packages), then writes $OUT/gpu_check.json (or
# ./gpu_check.json) and prints it. Record its figures in benchmarks/RESULTS.md with the device named.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$(command -v "$PYTHON")" ] || make install
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 480 "$PYTHON" -m benchmarks.checks.gpu_check --out "${OUT:-.}/gpu_check.json" "$@"
cat "${OUT:-.}/gpu_check.json"
