#!/usr/bin/env bash
# GPU check of `rlhf bench ppo` (GPT-2 124M size, bf16, batch 64, 128 new tokens): tokens/s, phase split, peak GPU
# memory, MFU of the update. Usage: bash benchmarks/gpu_check.sh [--device cuda] [--dtype bfloat16] [--set k=v ...]
# Needs torch with CUDA and transformers (requirements.lock). Writes $OUT/gpu_check.json when $OUT is set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>/dev/null || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
exec timeout "${GPU_CHECK_TIMEOUT:-540}" "$PY" benchmarks/gpu_check.py "$@"
