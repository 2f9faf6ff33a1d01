"""`rlhf bench ppo`: our PPO iterations, bare, on the TRL CPU baseline's configuration (rlhf_lib/ppo/bench.py),
printed as a table or, with `--json`, as one JSON object on the last stdout line with TRL's key names.
No Prefect: the loop runs in this process exactly as `PPOTrainer.step()` would."""

from __future__ import annotations


def parse_sets(sets: list[str]):
    """`key=value` pairs (values as YAML scalars) over the defaults; unknown keys and bad types name the key."""
    import yaml
    from pydantic import ValidationError

    from rlhf_lib.ppo.bench import BenchPPOConfig

    raw = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"rlhf bench ppo: --set {item!r}: expected KEY=VALUE")
        raw[key.strip()] = yaml.safe_load(value)
    try:
        return BenchPPOConfig(**raw)
    except ValidationError as e:
        bad = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise SystemExit(f"rlhf bench ppo: bad --set: {bad}") from None


def _line(i: int, r: dict) -> str:
    return (f"iter {i:3d}  total {r['total_s']:.3f}s  gen {r['generate_s']:.3f}s  score {r['rollout_score_s']:.3f}s  "
            f"update {r['update_s']:.3f}s  rss {r['peak_rss_mib']:.0f}MiB  cpu {r['cpu_s']:.2f}s  "
            f"foreign-cpu {r['foreign_cpu_s']:.2f}s")


def report(s: dict) -> str:
    c = s["config"]
    times = f"{s['s_per_iter_median']:.3f} ({s['s_per_iter_min']:.3f} - {s['s_per_iter_max']:.3f})"
    split = " / ".join(f"{s[k]:.3f}" for k in ("generate_s_median", "rollout_score_s_median", "update_s_median",
                                                "other_s_median"))
    rates = " / ".join(f"{s[k]:.1f}" for k in ("gflops_generate", "gflops_score", "gflops_update"))
    rows = [
        ("s / iteration, median (min - max)", f"{times} over {s['measured_iterations']} iterations"),
        ("  generate / score+GAE / update / other", f"{split} s"),
        ("generated tokens / s, end-to-end",
         f"{s['tokens_per_s_end_to_end']:.0f}  (generate only: {s['tokens_per_s_generate']:.0f})"),
        ("peak RSS", f"{s['peak_rss_mib']:.0f} MiB  (after building the models: {s['rss_after_models_mib']:.0f})"),
        ("work per iteration (analytic)", f"{s['gflop_per_iter']:.1f} GFLOP"),
        ("achieved GFLOP/s, whole iteration", (f"{s['gflops_achieved']:.1f} = {100 * s['roofline_share']:.0f} % "
                                               f"of a {s['roofline_gflops']:.0f} GFLOP/s matmul roofline")),
        ("  generate / score / update", f"{rates} GFLOP/s"),
        ("MFU of the update", f"{100 * s['mfu_update']:.1f} % (vs {s['mfu_reference']})"),
        ("quiet iterations; CPU-s per iteration",
         f"{s['quiet_iterations']} of {s['measured_iterations']}; {s['cpu_s_per_iter_median']:.2f}"),
    ]
    if "peak_gpu_mem_mib" in s:
        rows.append(("peak GPU memory (allocated)", f"{s['peak_gpu_mem_mib']:.0f} MiB"))
    head = (f"PPO, {c['rollout_batch_size']} prompts x {c['prompt_length']} + {c['response_length']} tokens, GPT-2 "
            f"{c['n_layer']}x{c['n_embd']}, vocab {c['vocab_size']}, {c['dtype']} on {c['device']}, "
            f"{c['torch_threads']} threads")
    return "\n".join([head] + [f"  {k:40s} {v}" for k, v in rows])


def bench_ppo(sets: list[str]) -> dict:
    """Run the benchmark, printing a line per iteration and the report; returns the summary."""
    cfg = parse_sets(sets)
    from rlhf_lib.ppo.bench import run

    summary = run(cfg, on_iteration=lambda i, r: print(_line(i, r), flush=True))
    print(report(summary), flush=True)
    return summary
