#!/usr/bin/env python3
"""The TRL side of `benchmarks/dpo_vs_trl.py`: TRL 1.12's `DPOTrainer` scores one batch. Runs in the TRL venv
(benchmarks/.trl-venv) and imports nothing of this project: only the files in DIR that the other side wrote.

    benchmarks/.trl-venv/bin/python benchmarks/trl_dpo_side.py DIR

DIR holds policy/ and reference/ (two causal LMs, save_pretrained), tokenizer/ and batch.json: the pairs' texts,
the rows this project encoded ({"prompt_ids", "chosen_ids", "rejected_ids"} per pair) and the cases
([{"name", "loss_type", "beta", "label_smoothing"}]). For each case one `DPOTrainer` (policy, ref_model =
reference, the texts as train_dataset, which it tokenises its own way) computes `compute_loss` on one batch of its
own data collator, fed this project's rows so that both sides score the very same token ids; the last stdout line is
a JSON object: the loss and TRL's logged metrics per case, and whether TRL's own tokenisation of the texts gave the
same rows.

TRL 1.12's loss_type "sigmoid" ignores label_smoothing. cDPO, −(1−ε) log σ(β·h) − ε log σ(−β·h), is computed
through TRL's own losses: with A = −log σ(β·h), B = −log σ(−β·h), TRL's robust is ((1−ε)·A − ε·B)/(1−2ε), hence
cDPO = (1−ε)·A + ε·B = 2(1−ε)·sigmoid − (1−2ε)·robust (loss_type ["sigmoid", "robust"] with those loss_weights).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402

METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
           "logps/rejected")


def loss_args(case: dict) -> dict:
    """DPOConfig's loss keys for a case: cDPO (sigmoid with ε > 0) as TRL's sigmoid and robust combined."""
    eps = case["label_smoothing"]
    if case["loss_type"] == "sigmoid" and eps:
        return {"loss_type": ["sigmoid", "robust"], "loss_weights": [2 * (1 - eps), -(1 - 2 * eps)],
                "label_smoothing": eps}
    return {"loss_type": [case["loss_type"]], "label_smoothing": eps}


def score(directory: Path, batch: dict, case: dict, out_dir: str) -> tuple[dict, bool]:
    tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer")
    policy = AutoModelForCausalLM.from_pretrained(directory / "policy", dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(directory / "reference", dtype=torch.float32)
    args = DPOConfig(output_dir=out_dir, beta=case["beta"], per_device_train_batch_size=len(batch["pairs"]),
                     report_to="none", use_cpu=True, bf16=False, fp16=False, save_strategy="no",
                     precompute_ref_log_probs=False, disable_dropout=True, max_length=None, **loss_args(case))
    trainer = DPOTrainer(model=policy, ref_model=reference, args=args, processing_class=tokenizer,
                         train_dataset=Dataset.from_list(batch["pairs"]))
    rows = [{k: list(r[k]) for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in trainer.train_dataset]
    same_tokens = rows == batch["rows"]
    inputs = trainer._prepare_inputs(trainer.data_collator(batch["rows"]))
    trainer.model.train()  # as in a training step; dropout is off (disable_dropout, and the configs' 0.0)
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, inputs)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return {"loss": float(loss), **{k: float(logged[k]) for k in METRICS}}, same_tokens


def main() -> None:
    directory = Path(sys.argv[1])
    batch = json.loads((directory / "batch.json").read_text())
    torch.set_num_threads(1)
    results, same = {}, True
    with tempfile.TemporaryDirectory() as out_dir:
        for case in batch["cases"]:
            results[case["name"]], same_tokens = score(directory, batch, case, out_dir)
            same = same and same_tokens
    print(json.dumps({"trl_version": trl.__version__, "torch_version": torch.__version__,
                      "tokens_identical": same, "results": results}))


if __name__ == "__main__":
    main()
