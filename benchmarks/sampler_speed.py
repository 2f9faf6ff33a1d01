#!/usr/bin/env python3
"""Eager against compiled sampling (`ppo.rollout_engine: hf` vs `compiled`): tokens per second of the same sampling
call (`rlhf_lib.lm.generation.sample`, every row to `--new-tokens`), the compile seconds apart, on one model.

Each engine samples `--repeats` times after one warm-up call (for the compiled one, the call that compiles); the
median call counts. The two draw the same tokens under one seed in float32 (checked here too). Run it alone on the
host: a second job on 2 cores slows each side 3-5x.

    python benchmarks/sampler_speed.py --model smollm2 --batch 8 --new-tokens 128      # SmolLM2-135M on a CPU
    python benchmarks/sampler_speed.py --shape gpt2 --device cuda --batch 64 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = Path(ROOT / "data" / "hh-harmless" / "test.jsonl")


def prompts(tokenizer, n: int) -> list[str]:
    """The first n HH test prompts through the model's chat template (as the smollm2-hh preset renders them)."""
    from rlhf_lib.data.hh import split_transcript, transcript_messages

    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:n]]
    return [tokenizer.apply_chat_template(transcript_messages(split_transcript(r["chosen"])[0]), tokenize=False,
                                          add_generation_prompt=True) for r in rows]


def timed_calls(fn, repeats: int) -> tuple[float, list[float], object]:
    """Seconds of the warm-up call, of each timed call, and the last result."""
    t0 = time.perf_counter()
    out = fn()
    warm = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return warm, times, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="a model folder, a .gguf file or smollm2 (imported on first use)")
    ap.add_argument("--shape", help="a known shape instead of --model (gpt2, pythia-160m, ...: `rlhf plan --shape`), "
                    "random weights and prompt tokens")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=192, help="prompts keep their last this many tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the JSON result here")
    a = ap.parse_args(argv)
    import torch

    from rlhf_lib.devices import DTYPES
    from rlhf_lib.lm.compiled import CompiledDecoder
    from rlhf_lib.lm.generation import encode_prompts, sample
    from rlhf_lib.model_dirs import load_causal_lm
    from benchmarks.ppo import matmul_roofline
    from stages.models_io import local_model

    torch.set_num_threads(a.threads)
    if a.shape:  # random weights of a known shape (`rlhf plan --shape`), random prompt tokens: speed only
        from transformers import AutoModelForCausalLM

        from rlhf_lib.shapes import model_config

        torch.manual_seed(0)
        path = a.shape
        model = AutoModelForCausalLM.from_config(model_config(a.shape, "--shape")).to(DTYPES[a.dtype])
        q = torch.randint(10, model.config.vocab_size, (a.batch, a.prompt_tokens))
        m = torch.ones_like(q)
        eos = pad = 0
    else:
        path = local_model(a.model)  # a .gguf file or smollm2: imported into <state>/imported on first use
        model, tok = load_causal_lm(Path(path), False, DTYPES[a.dtype])
        q, m = encode_prompts(tok, prompts(tok, a.batch), a.prompt_tokens)
        eos, pad = tok.eos_token_id, tok.pad_token_id
    model.to(a.device).eval()
    kw = dict(max_new_tokens=a.new_tokens, temperature=0.7, eos_token_id=eos, pad_token_id=pad, stop_at_eos=False)
    decoder = CompiledDecoder()
    runs = {}
    for name, dec in (("eager", None), ("compiled", decoder)):
        def call(dec=dec):
            out = sample(model, q, m, generator=torch.Generator().manual_seed(0), decoder=dec, **kw)
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            return out
        warm, times, out = timed_calls(call, a.repeats)
        tokens = a.batch * a.new_tokens
        runs[name] = {"warmup_s": round(warm, 2), "calls_s": [round(t, 3) for t in times],
                      "tokens_per_s": round(tokens / statistics.median(times), 1), "tokens": out[0]}
    same = bool(torch.equal(runs["eager"].pop("tokens"), runs["compiled"].pop("tokens")))
    speedup = runs["compiled"]["tokens_per_s"] / runs["eager"]["tokens_per_s"]
    result = {"model": str(path), "device": a.device, "dtype": a.dtype, "batch": a.batch, "new_tokens": a.new_tokens,
              "prompt_width": int(q.shape[1]), "threads": a.threads,
              "roofline_gflops": round(matmul_roofline(a.device, DTYPES[a.dtype]), 1),
              "compile_s": round(decoder.compile_seconds, 1), "compiles": decoder.compiles, "same_tokens": same,
              "eager": runs["eager"], "compiled": runs["compiled"], "speedup": round(speedup, 3)}
    print(json.dumps(result, indent=1))
    print(f"compiled / eager tokens/s: {speedup:.2f}x ({runs['compiled']['tokens_per_s']} vs "
          f"{runs['eager']['tokens_per_s']}), batch {a.batch}, {a.new_tokens} new tokens, {a.dtype} on {a.device}; "
          f"compile {decoder.compile_seconds:.1f} s; same tokens: {same}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
