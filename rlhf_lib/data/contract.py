"""The data contract: the files every task writes into the data stage's artifact, by key.

Every task (`rlhf_lib.tasks`) writes the five `CONTRACT_FILES`; a task may add `prompts_val` (validation prompts:
settings are chosen on them, and the demo's best constant reply is picked on them) and `adversarial_pairs` (minimal
pairs that the reward stage scores beside its held-out pairs). The stages read the files by these keys only.
"""

from __future__ import annotations

FILE_NAMES: dict[str, str] = {
    "sft": "sft.jsonl",
    "preferences": "preferences.jsonl",
    "prompts_train": "prompts_train.jsonl",
    "prompts_eval": "prompts_eval.jsonl",
    "eval_pairs": "eval_pairs.jsonl",
    "prompts_val": "prompts_val.jsonl",
    "adversarial_pairs": "adversarial_pairs.jsonl",
}
# The five files every task writes; `prompts_val` and `adversarial_pairs` are optional.
CONTRACT_FILES: tuple[str, ...] = ("sft", "preferences", "prompts_train", "prompts_eval", "eval_pairs")
OPTIONAL_FILES: tuple[str, ...] = ("prompts_val", "adversarial_pairs")
