#!/usr/bin/env python3
"""PPO judged by a reward model it never trained against (issue 38, item 3), in one command.

1. `rlhf run reward` with `data.skip_rows=SKIP` (and `--set name=judge`): a judge reward model trained on training
   rows the PPO reward model never reads (the preset's `data.max_rows` rows from row SKIP on; the PPO RM reads the
   first `data.max_rows`), scored on the preset's held-out pairs.
2. `rlhf run full` with `eval.best_of=[4, 16]` and `eval.judge` set to that reward model's `runs:/<id>/model`: SFT,
   the PPO reward model, PPO and the eval, in which the judge scores PPO, SFT and best-of-n of SFT on the held-out
   prompts.
3. Printed (Markdown, and JSON to --out): the judge's held-out accuracy, the eval report's baselines table (KL to SFT,
   judge and proxy reward, PPO's win rates against each, 95 % intervals) and `--samples` held-out prompts with the
   SFT, PPO and best-of-n replies.

    python benchmarks/judge_table.py --preset smollm2-hh --skip 640 --set resources.mixed_precision=no
    # reuse a trained SFT and PPO reward model; a judge from the base model instead of the SFT model:
    python benchmarks/judge_table.py ... --sft-model runs:/<sft>/model --reward-model runs:/<rm>/model \
        --judge-set reward.name_or_path=smollm2

Both runs share RLHF_HOME (default ~/.rlhf or --home), so a cached SFT, reward model or PPO is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rlhf(args: list[str], home: Path | None, log: Path) -> tuple[dict, float]:
    """One `rlhf ... --json` in its own process; its summary and wall seconds. Exits on failure, showing the log's
    tail."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if home is not None:
        env |= {"RLHF_HOME": str(home), "PREFECT_HOME": str(home / "prefect")}
    t0 = time.monotonic()
    with open(log, "w") as err:
        out = subprocess.run([sys.executable, "-m", "cli.main", *args, "--json"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=err, text=True)
    if out.returncode != 0:
        sys.exit(f"rlhf {' '.join(args)}: exit {out.returncode}; the log {log} ends:\n{log.read_text()[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1]), time.monotonic() - t0


def last_turn(prompt: str, width: int = 160) -> str:
    """The prompt's last human turn, one line (the report's samples hold the whole rendered conversation)."""
    for marker in ("<|im_start|>user\n", "Human: "):
        if marker in prompt:
            prompt = prompt.rsplit(marker, 1)[1]
    text = prompt.replace("<|im_end|>", " ").replace("<|im_start|>assistant", " ")
    if text.rstrip().endswith("Assistant:"):
        text = text.rstrip().removesuffix("Assistant:")
    text = " ".join(text.split())
    return text[:width] + ("..." if len(text) > width else "")


def markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    def cell(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "/")

    return "\n".join(lines + ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smollm2-hh")
    ap.add_argument("--skip", type=int, default=640, help="training rows the judge skips (data.skip_rows)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for both runs")
    ap.add_argument("--judge-set", action="append", default=[],
                    help="KEY=VALUE for the judge's run only, e.g. reward.name_or_path=smollm2 (a judge from the base "
                    "model, not from the SFT model the policy starts from)")
    ap.add_argument("--sft-model", help="SFT model URI for both runs (skips the sft stage)")
    ap.add_argument("--reward-model", help="PPO reward model URI for the full run (skips its reward stage)")
    ap.add_argument("--judge-run", help="MLflow run id of a judge trained before (a reward stage's run): step 1 is "
                    "skipped, its held-out accuracy read from that run")
    ap.add_argument("--samples", type=int, default=3, help="held-out prompts printed with every policy's reply")
    ap.add_argument("--home", help="RLHF_HOME of both runs (default: the environment's)")
    ap.add_argument("--out", help="write the JSON result here")
    a = ap.parse_args(argv)
    home = Path(a.home).resolve() if a.home else None
    logs = Path(tempfile.mkdtemp(prefix="judge-table-"))
    sets = [x for s in a.set for x in ("--set", s)]
    judge_sets = [x for s in a.judge_set for x in ("--set", s)]
    pinned = ["--sft-model", a.sft_model] if a.sft_model else []

    if a.judge_run:
        judge_run, judge_s = a.judge_run, 0.0
    else:
        judge, judge_s = rlhf(["run", "reward", "--preset", a.preset, "--set", f"data.skip_rows={a.skip}",
                               "--set", "name=judge", *sets, *judge_sets, *pinned], home, logs / "judge.log")
        judge_run = judge["stages"]["reward"]["mlflow_run_id"]
    spec = f'{{name: judge, kind: model, model: "runs:/{judge_run}/model"}}'
    full, full_s = rlhf(["run", "full", "--preset", a.preset, "--set", "eval.best_of=[4,16]",
                         "--set", f"eval.judge={spec}", *sets, *pinned,
                         *(["--reward-model", a.reward_model] if a.reward_model else [])], home, logs / "full.log")

    from mlflow import MlflowClient

    from stages.report_best_of import baselines_table

    client = MlflowClient(full["mlflow_tracking_uri"])
    judge_metrics = client.get_run(judge_run).data.metrics
    eval_run = full["stages"]["eval"]["mlflow_run_id"]
    report = json.loads(Path(client.download_artifacts(eval_run, "report/report.json", str(logs))).read_text())
    samples = json.loads(Path(client.download_artifacts(eval_run, "report/samples.json", str(logs))).read_text())
    table = baselines_table(report["metrics"], report["intervals"])
    columns = (("SFT", "sft_response"), ("PPO", "ppo_response"), ("best-of-4", "best_of_4_response"),
               ("best-of-16", "best_of_16_response"))
    replies = [{"prompt (last turn)": last_turn(s["prompt"])} | {who: s.get(key, "") for who, key in columns}
               for s in samples[:a.samples]]
    acc = judge_metrics.get("reward/heldout_accuracy")
    lo, hi = (judge_metrics.get(f"reward/heldout_accuracy_ci95_{e}") for e in ("low", "high"))
    print(f"judge RM (MLflow run {judge_run}, training rows {a.skip}+): held-out accuracy {acc:.3f} [{lo:.3f}, "
          f"{hi:.3f}]; {judge_s:.0f} s\nPPO pipeline and eval (MLflow run {eval_run}): {full_s:.0f} s\n")
    print(markdown(table) + "\n")
    for r in replies:
        print("\n".join(f"- **{k}**: {' '.join(str(v).split())}" for k, v in r.items()) + "\n")
    if a.out:
        result = {"judge_run": judge_run, "judge_sets": a.judge_set, "sft_model": a.sft_model,
                  "reward_model": a.reward_model, "judge_accuracy": [acc, lo, hi], "eval_run": eval_run, "sets": a.set,
                  "seconds": {"judge": judge_s, "full": full_s}, "table": table, "samples": replies}
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
