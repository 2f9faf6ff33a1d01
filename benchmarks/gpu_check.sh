#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py: micro pipeline on the GPU against the CPU, a bf16 run, `rlhf bench ppo` at
# GPT-2 124M shape in bf16, the memory estimate against the measured peak, vLLM where installed), in at most
# GPU_CHECK_TIMEOUT seconds (480). Writes $OUT/gpu_check.json when $OUT is set.
#
#   bash benchmarks/gpu_check.sh [--device cuda:1] [--peak-tflops 312] [--set bench.iterations=10 ...]
#
# The interpreter: $PYTHON, else .venv/bin/python, else python3. It needs torch with CUDA and the packages of
# requirements.lock; a machine without a network cannot install them, so the check says which are missing and
# exits 3 (incomplete) instead. Exit 0: passed; 1: a check failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benchmarks/find_python.sh gpu_check
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null || echo "# nvidia-smi: none"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
budget="${GPU_CHECK_TIMEOUT:-480}"
exec timeout "$budget" "$PY" benchmarks/gpu_check.py --budget-s "$((budget - 30))" "$@"
