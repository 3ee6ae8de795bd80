#!/usr/bin/env bash
# On a machine with CUDA: rewardlab's GRPO steps on the Qwen2.5-0.5B shape in bf16; prints tokens/s and peak GPU
# memory (benchmarks/gpu_check.py, whose flags it passes on). Uses $PYTHON, else the checkout's .venv, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH="${PYTHONPATH:-$PWD/src}"
exec "$PY" benchmarks/gpu_check.py "$@"
