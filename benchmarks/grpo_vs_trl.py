#!/usr/bin/env python3
"""Time-to-quality against TRL 1.12's `GRPOTrainer` on `smollm2-arith` (issue 58, item 3), in one command:

    python benchmarks/grpo_vs_trl.py --seeds 0,1,2 --ours grpo,grpo-async,ppo --home H [--set KEY=VALUE ...]

Both sides train the same imported SmolLM2-135M-Instruct (float32, 2 threads) on the same rendered prompts (the
preset's data stage, run here) with the same exact-match reward and reader, group size, batch, minibatches, epochs,
learning rate, Adam epsilon, gradient clip, KL coefficient, clip range, temperature and new-token cap; each side's
own GRPO (ours: the KL as a per-token k1 penalty in the reward; TRL: beta times k3 in the loss, loss_type dapo).
Each saves its policy after every `--eval-every` iterations with its clock stopped; afterwards one evaluator (this
project's sampler, one seed, T 0.7) scores every saved policy on the 250 held-out prompts (25 problems x 10, none
trained on), with cluster intervals over problems. The table: held-out exact match against training seconds per
side and seed, the seconds ours needs to reach TRL's final accuracy (the first saved point at or above it) over
TRL's whole run, and each side's peak RSS. Sides run one after another, alone: a figure from a shared host is not a
figure. Runs already in the folder's record.json (same settings) are kept: a later call adds arms or seeds. `--ours` arms: grpo, grpo-async (staleness 1), ppo, ppo-async. TRL runs in benchmarks/.trl-venv (built by
setup_trl_venv.sh when missing).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.dpo_vs_trl import trl_python  # noqa: E402
from benchmarks.judge_table import rlhf  # noqa: E402

ARMS = {"grpo": ["ppo.advantage_estimator=grpo"],
        "grpo-async": ["ppo.advantage_estimator=grpo", "ppo.async_rollouts.staleness=1"],
        "ppo": [], "ppo-async": ["ppo.async_rollouts.staleness=1"]}
HOST = ["resources.mixed_precision=no", "resources.frozen_dtype=float32", "ppo.rm_offset_samples=0"]


def settings(sets: list[str], eval_every: int) -> dict:
    """The shared settings, read from the preset (as our side runs it)."""
    from flows.settings import load_config

    c = load_config("smollm2-arith", None, HOST + sets)
    p = c.ppo
    return {"iterations": p.iterations, "batch_size": p.batch_size, "minibatches": p.minibatches, "epochs": p.epochs,
            "group_size": p.group_size, "lr": p.lr, "adam_eps": p.adam_eps, "max_grad_norm": p.max_grad_norm,
            "kl_coef": p.kl_coef, "clip_eps": p.clip_eps, "temperature": p.temperature,
            "max_new_tokens": p.max_new_tokens, "torch_threads": c.torch_threads, "eval_every": eval_every}


def write_inputs(directory: Path, home: Path, sets: list[str], eval_every: int) -> dict:
    """The preset's data stage (cached in `home`), the imported model's folder, the rows and settings."""
    import os

    out, _ = rlhf(["run", "sft", "--preset", "smollm2-arith", *[x for s in HOST + sets for x in ("--set", s)]],
                  home, directory / "data.log")
    summary = out["seeds"][next(iter(out["seeds"]))] if "seeds" in out else out
    os.environ["RLHF_HOME"] = str(home)
    from stages.artifact_cache import download
    from stages.tracking import setup_mlflow

    setup_mlflow()
    data = download(f"runs:/{summary['stages']['data']['mlflow_run_id']}/data")
    rows = {name: [json.loads(line) for line in (data / f"prompts_{name}.jsonl").read_text().splitlines()]
            for name in ("train", "eval")}
    inputs = {"model_dir": str(home / "imported" / "smollm2"), "train": rows["train"], "eval": rows["eval"],
              "settings": settings(sets, eval_every)}
    (directory / "inputs.json").write_text(json.dumps(inputs))
    return inputs


def run_ours(directory: Path, arm: str, seed: int, sets: list[str]) -> None:
    """Our side in this process (called as `--side ours`): the PPO loop bare, timed, saving after every
    eval_every iterations with the clock stopped."""
    import resource

    from flows.settings import load_config
    from rlhf_lib.model_dirs import save_model
    from rlhf_lib.ppo.loop import PPOJob, build_trainer, run_iteration
    from rlhf_lib.process import configure_process

    inputs = json.loads((directory / "inputs.json").read_text())
    s = inputs["settings"]
    cfg = load_config("smollm2-arith", None, HOST + ARMS[arm] + sets + [f"ppo.seed={seed}"])
    configure_process(cfg.torch_threads)
    out = directory / f"{arm}-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    train = inputs["train"]
    job = PPOJob(config=cfg.model_dump(mode="json"), sft_dir=inputs["model_dir"], reward_dir=None,
                 prompts=[r["prompt"] for r in train], out_dir=str(out / "final"),
                 columns={r["prompt"]: {"answer": r["answer"]} for r in train})
    trainer = build_trainer(job)
    points, seconds = [], 0.0
    try:
        for it in range(cfg.ppo.iterations):
            t0 = time.perf_counter()
            run_iteration(trainer)
            seconds += time.perf_counter() - t0
            if (it + 1) % s["eval_every"] == 0:
                save_model(trainer.models.policy, trainer.models.tokenizer, out / f"iter_{it + 1:04d}")
                points.append({"iteration": it + 1, "seconds": seconds})
    finally:
        trainer.close()
    record = {"points": points, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    (out / "run.json").write_text(json.dumps(record, indent=1))


def evaluate(model_dir: Path, rows: list[dict], seed: int = 1234, batch: int = 50, max_new_tokens: int = 8,
             temperature: float = 0.7) -> dict:
    """Held-out exact match of one saved policy (this project's sampler and reader), with its cluster interval
    over problems."""
    import torch

    from rlhf_lib.intervals import cluster_interval
    from rlhf_lib.lm.generation import decode_responses, encode_prompts, sample
    from rlhf_lib.model_dirs import load_causal_lm
    from rlhf_lib.rewards.builtin import exact_match

    model, tok = load_causal_lm(model_dir)
    model.eval()
    gen, right = torch.Generator().manual_seed(seed), []
    with torch.inference_mode():
        for i in range(0, len(rows), batch):
            chunk = rows[i : i + batch]
            q, qm = encode_prompts(tok, [r["prompt"] for r in chunk], 10_000)
            r, rm, _ = sample(model, q, qm, max_new_tokens=max_new_tokens, temperature=temperature,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, generator=gen)
            right += exact_match([], decode_responses(tok, r, rm), answer=[x["answer"] for x in chunk], read="last")
    lo, hi = cluster_interval(right, [r["prompt"] for r in rows])
    return {"accuracy": sum(right) / len(right), "ci95": [lo, hi]}


def same_inputs(trl_run: dict, inputs: dict) -> dict:
    """Whether TRL's reward read the probe replies as our exact match does, and fed generate our prompt's ids."""
    from rlhf_lib.model_dirs import load_tokenizer
    from rlhf_lib.rewards.builtin import exact_match

    probes = ["The answer is 15.", "15", "7 + 8 = 15", "fifteen", "-3", "1 5", "15.5", "The sum is 14, not 15", ""]
    ours = exact_match([], probes, answer=["15"] * len(probes), read="last")
    tok = load_tokenizer(Path(inputs["model_dir"]))
    ids = tok(inputs["train"][0]["prompt"], add_special_tokens=False)["input_ids"]
    return {"reader": ours == trl_run["probe_rewards"], "prompt_ids": ids == trl_run["prompt_ids"]}


def time_to(points: list[dict], target: float) -> float | None:
    """The training seconds of the first saved point whose accuracy is at or above `target`."""
    return next((p["seconds"] for p in points if p["accuracy"] >= target), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--ours", default="grpo,grpo-async")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--home", type=Path, default=Path.home() / ".rlhf")
    ap.add_argument("--dir", type=Path, default=None, help="the work folder (default: HOME/grpo_vs_trl)")
    ap.add_argument("--venv", type=Path, default=HERE / ".trl-venv")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--side", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)  # our side's subprocess
    args = ap.parse_args()
    directory = args.dir or args.home / "grpo_vs_trl"
    if args.side:
        run_ours(directory, args.side[0], int(args.side[1]), args.sets)
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    inputs = write_inputs(directory, args.home, args.sets, args.eval_every)
    python = trl_python(args.venv)
    # TRL 1.12's GRPO trainer imports `requests` (its vLLM client) at import; the PPO baseline's pinned venv lacks it.
    if subprocess.run([str(python), "-c", "import requests"], capture_output=True).returncode:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "requests"], check=True)
    # An earlier record of the same settings in this folder: its evaluated runs are kept, not run again (add arms).
    old = json.loads((directory / "record.json").read_text()) if (directory / "record.json").exists() else {}
    same = old.get("settings") == inputs["settings"]
    start = old["start"] if same else evaluate(Path(inputs["model_dir"]), inputs["eval"])
    record: dict = {"start": start, "settings": inputs["settings"], "runs": old.get("runs", {}) if same else {},
                    **({"same_inputs": old["same_inputs"]} if same and "same_inputs" in old else {})}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in ["trl", *args.ours.split(",")]:
            name = f"{arm}-{seed}"
            if name in record["runs"]:
                continue
            cmd = ([str(python), str(HERE / "trl_grpo_side.py"), str(directory), str(seed)] if arm == "trl" else
                   [sys.executable, __file__, "--home", str(args.home), "--dir", str(directory), "--side", arm,
                    str(seed), *[x for s in args.sets for x in ("--set", s)]])
            with open(directory / f"{name}.log", "w") as log:
                if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode:
                    sys.exit(f"{name} failed: see {directory / f'{name}.log'}")
            run = json.loads((directory / name / "run.json").read_text())
            if arm == "trl":
                record["same_inputs"] = same_inputs(run, inputs)
            for p in run["points"]:
                p.update(evaluate(directory / name / f"iter_{p['iteration']:04d}", inputs["eval"]))
                shutil.rmtree(directory / name / f"iter_{p['iteration']:04d}")
            record["runs"][name] = run
            (directory / "record.json").write_text(json.dumps(record, indent=1))
    arms = ["trl", *dict.fromkeys(n.rsplit("-", 1)[0] for n in record["runs"] if not n.startswith("trl-"))]
    print(table(record, args.seeds, arms))
    return 0


def table(record: dict, seeds: str, arms: list[str]) -> str:
    from benchmarks.arith_table import fmt

    start = record["start"]
    lines = [f"start (the imported model): {fmt({'a': start['accuracy'], 'a_ci95': start['ci95']}, 'a')}; "
             f"TRL read the probes and tokenised the prompts as we do: {record.get('same_inputs')}",
             "| arm | seed | held-out exact match at each save (training s) | final | s to TRL's final | / TRL's s "
             "| peak RSS MiB | RSS / TRL's |", "|" + " --- |" * 8]
    for seed in seeds.split(","):
        trl = record["runs"].get(f"trl-{seed}")
        for arm in arms:
            run = record["runs"].get(f"{arm}-{seed}")
            if run is None:
                continue
            pts = run["points"]
            curve = ", ".join(f"{p['accuracy']:.2f} ({p['seconds']:.0f})" for p in pts)
            final = fmt({"a": pts[-1]["accuracy"], "a_ci95": pts[-1]["ci95"]}, "a")
            target = trl["points"][-1]["accuracy"] if trl else None
            reach = time_to(pts, target) if target is not None else None
            ratio = f"{reach / trl['points'][-1]['seconds']:.2f}" if reach is not None else "not reached"
            rss = f"{run['peak_rss_mib'] / trl['peak_rss_mib']:.2f}" if trl else "-"
            lines.append(f"| {arm} | {seed} | {curve} | {final} | {reach if reach is None else round(reach)} | "
                         f"{ratio} | {run['peak_rss_mib']:.0f} | {rss} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
