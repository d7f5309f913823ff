#!/usr/bin/env bash
# officellm's one GPU check: kernels vs references, greedy parity vs transformers, decode step
# time vs the memory floor, throughput vs transformers' generate_batch, start-up lines.
# Finishes in under 8 minutes on an H200; writes gpu_check.json and gpu_check.md under $OUT
# (else benchmarks/results/). Without CUDA it smoke-tests its CPU-side logic at toy sizes.
#   benchmarks/gpu_check.sh [--sections abcde] [--requests 256] ...   (see gpu_check.py -h)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=python3; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
# The GPU machine has no network and the check needs none: no Hub lookups, no waiting on them.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# A hard stop just under 8 minutes, beyond the script's own 440 s deadline.
exec timeout -k 5 470 "$PY" -u benchmarks/gpu_check.py "$@"
