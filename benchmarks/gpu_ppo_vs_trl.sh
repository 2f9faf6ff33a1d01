#!/usr/bin/env bash
# Our PPO iteration against TRL 1.12's PPOTrainer on one GPU (issue 58 item 4, its PPO half): `rlhf bench ppo` and
# benchmarks/trl_ppo_baseline.py on the same GPU, one after the other, at the GPT-2 124M shape (12 layers, d = 768,
# vocabulary 50,257, four random-init models), 64 prompts of 64 tokens, 128 sampled each without early stop, 1 epoch
# x 4 minibatches, TRL's baseline settings otherwise (benchmarks/presets/trl-baseline.yaml), bf16 autocast on both
# sides over float32 weights. Prints each side's seconds per iteration with its phases, the ratio (goal: ours >= 2x
# TRL's) and our MFU per phase (FLOPs over GPU_PEAK_TFLOPS, default 989: an H100 SXM's dense bf16; on the CPU dry run
# the measured matmul roofline). At most GPU_PPO_TIMEOUT seconds (420). Writes
# $OUT/ppo_ours.json and $OUT/ppo_trl.json when $OUT is set.
#
#   bash benchmarks/gpu_ppo_vs_trl.sh --prepare   # here, with PyPI: TRL 1.12.0's wheel into benchmarks/.gpu-wheels/
#   bash benchmarks/gpu_ppo_vs_trl.sh             # on the GPU machine (the device tool's carry: benchmarks/.gpu-wheels)
#   GPU_PPO_DRY=1 bash benchmarks/gpu_ppo_vs_trl.sh   # the CPU dry run: tiny shapes, 3 iterations a side
#
# The interpreter: $PYTHON, else .venv/bin/python, else python3: torch (with CUDA), transformers, accelerate and
# datasets (requirements.lock); TRL itself is imported from the carried wheel (pure Python, no dependencies pulled).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WHEELS=benchmarks/.gpu-wheels
source benchmarks/find_python.sh gpu_ppo_vs_trl
if [ "${1:-}" = "--prepare" ]; then
  "$PY" -m pip download --no-deps --only-binary=:all: trl==1.12.0 -d "$WHEELS"
  ls -l "$WHEELS"; exit 0
fi
wheel=$(ls "$WHEELS"/trl-1.12.0-*.whl 2>/dev/null | head -1 || true)
[ -n "$wheel" ] || { echo "gpu_ppo_vs_trl: INCOMPLETE: no TRL wheel in $WHEELS (run with --prepare first)" >&2; exit 3; }
export PYTHONPATH="$PWD:$PWD/$wheel${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TRL_EXPERIMENTAL_SILENCE=1 WANDB_DISABLED=true PYTHONUNBUFFERED=1
if [ -n "${GPU_PPO_DRY:-}" ]; then
  device=cpu cpu=true iters=3 warm=1 peak=()
  shape=(1 2 32 256 8 8 8 2)
else
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' || {
    echo "gpu_ppo_vs_trl: INCOMPLETE: torch sees no CUDA GPU here" >&2; exit 3; }
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
  device=cuda cpu=false iters=6 warm=2 peak=(--set "bench.peak_tflops=${GPU_PEAK_TFLOPS:-989}")
  shape=(12 12 768 50257 64 128 64 4)
fi
read -r layers heads embd vocab prompt new batch mbs <<< "${shape[*]}"
out="${OUT:-$(mktemp -d)}"
end=$((SECONDS + ${GPU_PPO_TIMEOUT:-420}))
"$PY" -c 'import trl; print("trl", trl.__version__, "from", trl.__file__)'
timeout $((end - SECONDS)) "$PY" -m cli.main bench ppo --json --set bench.device=$device \
  --set model.n_layer=$layers --set model.n_head=$heads --set model.n_embd=$embd --set model.vocab_size=$vocab \
  --set model.n_positions=$((prompt + new)) --set bench.prompt_length=$prompt --set ppo.max_new_tokens=$new \
  --set eval.max_new_tokens=$new \
  --set ppo.batch_size=$batch --set ppo.minibatches=$mbs --set ppo.score_batch_size=$batch \
  --set bench.iterations=$iters --set bench.warmup_iterations=$warm --set resources.mixed_precision=bf16 \
  ${peak[@]+"${peak[@]}"} | tail -1 > "$out/ppo_ours.json"
timeout $((end - SECONDS)) "$PY" benchmarks/trl_ppo_baseline.py --use-cpu $cpu --iterations $iters \
  --n-layer $layers --n-head $heads --n-embd $embd --vocab-size $vocab --n-positions $((prompt + new)) \
  --prompt-length $prompt --response-length $new --rollout-batch-size $batch --num-mini-batches $mbs \
  --local-rollout-forward-batch-size $batch --mixed-precision bf16 --json-out "$out/ppo_trl.json" > /dev/null
"$PY" - "$out" "$warm" <<'EOF'
import json, statistics, sys
from pathlib import Path
out, warm = Path(sys.argv[1]), int(sys.argv[2])
ours = json.loads((out / "ppo_ours.json").read_text())
trl = json.loads((out / "ppo_trl.json").read_text())
iters = [i["total_s"] for i in trl["iterations"][warm:]] or [i["total_s"] for i in trl["iterations"]]
t = statistics.median(iters)  # TRL's median over the same measured iterations as ours (its first `warm` left out)
phases = lambda d: f"{d['generate_s_median']:.3f} / {d['rollout_score_s_median']:.3f} / {d['update_s_median']:.3f}"
print(f"ours: {ours['s_per_iter_median']:.3f} s per iteration (generate / score+GAE / update {phases(ours)} s)")
print(f"TRL {trl['summary']['trl']}: {t:.3f} s per iteration (generate / score / update {phases(trl['summary'])} s)")
ratio = t / ours["s_per_iter_median"]
print(f"ours vs TRL: {ratio:.2f}x (goal >= 2x: {'met' if ratio >= 2 else 'missed'})")
peak = ours["config"]["bench"].get("peak_tflops")
roof = peak * 1e3 if peak else ours["roofline_gflops"]
print("our MFU per phase (of {:.0f} GFLOP/s, {}): ".format(roof, "the bf16 peak" if peak else "the measured roofline") + ", ".join(
    f"{k} {ours[f'gflops_{k}'] / roof:.1%}" for k in ("generate", "score", "update")))
EOF
