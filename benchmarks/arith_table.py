#!/usr/bin/env python3
"""RL on arithmetic that tests arithmetic (issue 54, item 3), in one command: `smollm2-arith` on its seeds with
each estimator, and the table of the start (greedy, sampled, best-of-4, best-of-16), the zero-reward control and RL
on the same 25 held-out problems (unordered pairs {a, a + 3} in both orders and every sum of 10: none, nor its twin
in the other order, is trained on), each with its cluster interval over problems.

    python benchmarks/arith_table.py --seeds 0,1,2 --estimators gae,grpo \
        --set resources.mixed_precision=no --set resources.frozen_dtype=float32

Per estimator: `rlhf run full --preset smollm2-arith --seeds S --set ppo.advantage_estimator=E` (the preset's
`eval.controls: [zero_reward]` runs the control; its `eval.best_of: [4, 16]` the oracle best-of-n of the start).
Then the start's greedy accuracy on each held-out problem (one reply each: greedy is deterministic), read with the
preset's exact match. The runs share RLHF_HOME (--home), so a rerun reads every stage from the cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.judge_table import rlhf  # noqa: E402

FIGURES = [("start greedy", "greedy", None), ("start (T 0.7)", "reward_mean_sft", None),
           ("best-of-4 of start", "best_of_4_reward_mean", None), ("best-of-16 of start", "best_of_16_reward_mean", None),
           ("zero-reward control", "zero_reward_reward_mean", None), ("RL", "reward_mean", None),
           ("RL - control", "reward_lead_over_zero_reward", None), ("RL - best-of-4", "reward_lead_over_best_of_4", None),
           ("RL - start", "reward_lead_over_sft", None), ("KL of RL", "kl_to_ref", None),
           ("KL of control", "zero_reward_kl_to_ref", None)]


def greedy_accuracy(summary: dict, home: Path) -> tuple[float, int]:
    """The start's greedy exact match on the distinct held-out problems of the run's data stage, and their count."""
    import os

    os.environ["RLHF_HOME"] = str(home)
    import torch

    from rlhf_lib.lm.generation import decode_responses
    from rlhf_lib.rewards.builtin import exact_match
    from stages.artifact_cache import download
    from stages.models_io import load_policy
    from stages.tracking import setup_mlflow

    setup_mlflow()
    data = download(f"runs:/{summary['stages']['data']['mlflow_run_id']}/data")
    rows = {}
    for line in (data / "prompts_eval.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["prompt"], row["answer"])
    model, tok = load_policy(summary["stages"]["sft"]["model_uri"])
    prompts = list(rows)
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    new = out[:, enc["input_ids"].shape[1]:]
    mask = torch.ones_like(new)
    for i in range(new.shape[0]):  # everything from the first EOS on is not the reply
        hit = (new[i] == tok.eos_token_id).nonzero()
        if len(hit):
            mask[i, int(hit[0]):] = 0
    texts = decode_responses(tok, new, mask)
    right = exact_match(prompts, texts, answer=[rows[p] for p in prompts], read="last")
    return sum(right) / len(right), len(right)


def fmt(ev: dict, key: str) -> str:
    v = ev.get(key)
    if v is None:
        return "n/a"
    ci = ev.get(f"{key}_ci95")
    return f"{v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def table_args(doc: str, estimators: str, **more: str) -> tuple[argparse.Namespace, list[str]]:
    """The arguments of a learning table's command (this one, chain_table.py, async_table.py: `more` adds options
    with their defaults), and its `--set`s as CLI words."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--estimators", default=estimators)
    for name, default in more.items():
        ap.add_argument(f"--{name}", default=default)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--home", type=Path, default=Path.home() / ".rlhf")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    args.home.mkdir(parents=True, exist_ok=True)
    return args, [x for s in args.sets for x in ("--set", s)]


def print_table(head: list[str], rows: list[list[str]], record: dict, out: Path | None) -> None:
    """The table in markdown on stdout, and the record as JSON at `out` when given."""
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if out:
        out.write_text(json.dumps(record, indent=1))


def main() -> None:
    args, sets = table_args(__doc__, "gae,grpo")
    rows, record = [], {}
    for est in args.estimators.split(","):
        log = args.home / f"arith-{est}.log"
        out, seconds = rlhf(["run", "full", "--preset", "smollm2-arith", "--seeds", args.seeds, *sets,
                             "--set", f"ppo.advantage_estimator={est}"], args.home, log)
        for seed, summary in out["seeds"].items():
            ev = dict(summary["eval"])
            ev["greedy"], n = greedy_accuracy(summary, args.home)
            record[f"{est}/{seed}"] = {"eval": ev, "stages": summary["stages"], "greedy_problems": n}
            rows.append([{"gae": "PPO", "grpo": "GRPO"}.get(est, est), str(seed)] + [fmt(ev, k) for _, k, _ in FIGURES])
        print(f"# {est}: {seconds / 60:.1f} min for seeds {args.seeds}", file=sys.stderr)
    print_table(["estimator", "seed"] + [name for name, _, _ in FIGURES], rows, record, args.out)


if __name__ == "__main__":
    main()
