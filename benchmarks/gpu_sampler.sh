#!/usr/bin/env bash
# Eager against compiled sampling on one GPU (issue 58 item 4, its sampling half): benchmarks/sampler_speed.py at the
# GPT-2 124M and SmolLM2-135M shapes (random weights, random prompt tokens: speed only), batch 64, 192 prompt and
# 128 new tokens, bf16, compiled with CUDA graphs. Needs no model files and no network; at most GPU_SAMPLER_TIMEOUT
# seconds (420). Writes $OUT/sampler_<shape>.json when $OUT is set.
#
#   bash benchmarks/gpu_sampler.sh [--batch 64] [--new-tokens 128]
#
# The interpreter: $PYTHON, else .venv/bin/python, else python3 (torch with CUDA and transformers).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benchmarks/find_python.sh gpu_sampler
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' || {
  echo "gpu_sampler: INCOMPLETE: torch sees no CUDA GPU here" >&2; exit 3; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
budget="${GPU_SAMPLER_TIMEOUT:-420}"
end=$((SECONDS + budget))
for shape in gpt2-124m smollm2-135m; do
  left=$((end - SECONDS))
  [ "$left" -gt 30 ] || { echo "gpu_sampler: out of time before $shape" >&2; exit 1; }
  out=()
  [ -n "${OUT:-}" ] && out=(--out "$OUT/sampler_$shape.json")
  timeout "$left" "$PY" benchmarks/sampler_speed.py --shape "$shape" --device cuda --dtype bfloat16 --batch 64 \
    --new-tokens 128 --prompt-tokens 192 ${out[@]+"${out[@]}"} "$@"
done
