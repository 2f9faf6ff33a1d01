"""Which stages an edit to each library module reruns (docs/architecture.md, "What a cache key covers").

A stage reruns when its own code key changes (`stages.code_deps.dependencies`: the modules it imports) or when a
stage before it reruns (its output is the next stage's input). The table pins the house's layering: PPO's modules
rerun PPO and eval only; what every stage shares lives in `rlhf_lib.lm`; the reward model's code leaves SFT alone.
"""

from __future__ import annotations

import pkgutil

import pytest

import rlhf_lib
from stages.code_deps import dependencies

STAGES = ("data", "sft", "reward", "ppo", "eval")  # flows.pipeline.STAGES, in the order each feeds the next


def reruns(module: str) -> tuple[str, ...]:
    """The stages an edit to `module` reruns: the first stage whose code imports it, and every stage after it."""
    hit = [i for i, s in enumerate(STAGES) if module in dependencies(f"stages.{s}")]
    return STAGES[min(hit):] if hit else ()


LIBRARY = sorted(m.name for m in pkgutil.walk_packages(rlhf_lib.__path__, "rlhf_lib."))
FROM_SFT, FROM_REWARD, FROM_PPO = STAGES[1:], STAGES[2:], STAGES[3:]


def test_the_stages_are_flows_pipeline_order():
    from flows.pipeline import STAGES as PIPELINE

    assert PIPELINE == STAGES


@pytest.mark.parametrize("module", [m for m in LIBRARY if m.startswith("rlhf_lib.ppo")])
def test_a_ppo_edit_reruns_ppo_and_eval_only(module):
    assert reruns(module) == FROM_PPO


@pytest.mark.parametrize(("module", "expected"), [
    ("rlhf_lib.sft", FROM_SFT),
    ("rlhf_lib.lm.scoring", FROM_SFT),  # SFT's loss reads log-probs through it
    ("rlhf_lib.lm.entropy", FROM_SFT),
    ("rlhf_lib.lm.generation", FROM_PPO),  # sampling: PPO's rollouts and eval's samples
    ("rlhf_lib.lm.masked", FROM_PPO),
    ("rlhf_lib.lm.kl", FROM_PPO),
    ("rlhf_lib.reward", FROM_REWARD),  # the reward model's loss does not rerun SFT
    ("rlhf_lib.reward_report", FROM_REWARD),
    ("rlhf_lib.prompt_sharing", FROM_REWARD),
    ("rlhf_lib.rewards.combine", FROM_PPO),
    ("rlhf_lib.rewards.retokenize", FROM_PPO),
    ("rlhf_lib.eval", ("eval",)),
    ("rlhf_lib.data.records", STAGES),
    ("rlhf_lib.config.ppo", STAGES),  # the typed config is read by every stage
    ("rlhf_lib.metric_docs", ()),  # documentation only
])
def test_rerun_table(module, expected):
    assert reruns(module) == expected


def test_no_stage_before_ppo_imports_ppo_code():
    for stage in STAGES[:3]:
        assert {m for m in dependencies(f"stages.{stage}") if m.startswith(("rlhf_lib.ppo", "stages.ppo"))} == set()
    assert {m for m in dependencies("stages.eval") if m.startswith(("rlhf_lib.ppo", "stages.ppo"))} == set()
