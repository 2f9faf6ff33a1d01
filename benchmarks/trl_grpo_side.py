#!/usr/bin/env python3
"""The TRL side of `benchmarks/grpo_vs_trl.py`: TRL 1.12's `GRPOTrainer` on the arithmetic task. Runs in the TRL
venv (benchmarks/.trl-venv) and imports nothing of this project: only the files in DIR that the other side wrote.

    benchmarks/.trl-venv/bin/python benchmarks/trl_grpo_side.py DIR SEED

DIR/inputs.json holds the imported model's folder, the training rows ({"prompt", "answer"}: prompts already rendered
through the model's chat template, so both sides read the very same text) and the shared settings. The trainer
samples `group_size` replies per prompt, `batch_size` replies per generation round, and takes `minibatches` optimizer
steps of `batch_size / minibatches` replies per round, `epochs` times over it (GRPO's num_iterations): the work of
one of our iterations per round. After every `eval_every` rounds the clock stops, the policy is saved to
DIR/trl-SEED/iter_NNNN/ and the clock goes on. DIR/trl-SEED/run.json: the training seconds at each save, the peak
RSS of the process, the versions, and the reward on fixed probe replies (the other side checks the reader against
its own exact match).
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

_INTEGER = re.compile(r"-?\d+")  # the reader of rlhf_lib.rewards.builtin.exact_match(read="last")
PROBES = ["The answer is 15.", "15", "7 + 8 = 15", "fifteen", "-3", "1 5", "15.5", "The sum is 14, not 15", ""]


def last_integer(text: str) -> int | None:
    found = _INTEGER.findall(text)
    return int(found[-1]) if found and re.fullmatch(r"-?\d{1,64}", found[-1]) else None


def exact_match(prompts, completions, answer, **_):
    """1.0 where the reply's last integer equals the row's answer (TRL's reward_funcs signature)."""
    return [float(last_integer(c) is not None and last_integer(c) == int(a)) for c, a in zip(completions, answer)]


class Clock(TrainerCallback):
    """Training seconds without the saves: the policy is saved after every `every` generation rounds."""

    def __init__(self, out: Path, tokenizer, steps_per_round: int, every: int):
        self.out, self.tokenizer, self.per_round, self.every = out, tokenizer, steps_per_round, every
        self.points: list[dict] = []
        self.t0 = self.paused = 0.0

    def on_train_begin(self, args, state, control, **kw):
        self.t0, self.paused = time.perf_counter(), 0.0

    def on_step_end(self, args, state, control, model=None, **kw):
        if state.global_step % (self.per_round * self.every):
            return
        seconds = time.perf_counter() - self.t0 - self.paused
        p0 = time.perf_counter()
        rounds = state.global_step // self.per_round
        model.save_pretrained(self.out / f"iter_{rounds:04d}", safe_serialization=True)
        self.tokenizer.save_pretrained(self.out / f"iter_{rounds:04d}")
        self.points.append({"iteration": rounds, "seconds": seconds})
        self.paused += time.perf_counter() - p0


def main(directory: Path, seed: int) -> None:
    inputs = json.loads((directory / "inputs.json").read_text())
    s = inputs["settings"]
    torch.set_num_threads(s["torch_threads"])
    out = directory / f"trl-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(inputs["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(inputs["model_dir"], dtype=torch.float32)
    per_round = s["minibatches"] * s["epochs"]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), seed=seed, data_seed=seed, use_cpu=True, bf16=False, report_to=[],
        save_strategy="no", logging_steps=per_round, disable_tqdm=True,
        learning_rate=s["lr"], lr_scheduler_type="constant", adam_epsilon=s["adam_eps"],
        max_grad_norm=s["max_grad_norm"], weight_decay=0.0, disable_dropout=True,
        per_device_train_batch_size=s["batch_size"] // s["minibatches"], gradient_accumulation_steps=1,
        steps_per_generation=s["minibatches"], num_generations=s["group_size"], num_iterations=s["epochs"],
        max_completion_length=s["max_new_tokens"], temperature=s["temperature"], top_k=0, top_p=1.0,
        beta=s["kl_coef"], epsilon=s["clip_eps"], loss_type="dapo", scale_rewards="group",
        max_steps=s["iterations"] * per_round,
    )
    clock = Clock(out, tokenizer, per_round, s["eval_every"])
    trainer = GRPOTrainer(model=model, reward_funcs=[exact_match], args=args,
                          train_dataset=Dataset.from_list(inputs["train"]), processing_class=tokenizer,
                          callbacks=[clock])
    trainer.train()
    prompt = inputs["train"][0]["prompt"]
    record = {
        "points": clock.points, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "trl": trl.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "probe_rewards": exact_match([""] * len(PROBES), PROBES, ["15"] * len(PROBES)),
        "prompt_ids": tokenizer(text=[prompt])["input_ids"][0],  # what TRL's _tokenize_prompts feeds generate
        "log": [h for h in trainer.state.log_history if "reward" in h],
    }
    (out / "run.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
