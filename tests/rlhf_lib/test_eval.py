"""Held-out comparison: the gold win rate needs a judge; the RM-judged win rate is always there."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.eval import Generations, compare, intervals, win_rate


def gens(scores, gold=None) -> Generations:
    n = len(scores)
    return Generations(["x"] * n, torch.tensor(scores), torch.full((n,), 4.0), torch.ones(n, dtype=torch.bool),
                       torch.zeros(n), gold)


def test_win_rate_counts_ties_half():
    # wins, tie, loss, win -> (1 + 0.5 + 0 + 1) / 4
    assert win_rate(torch.tensor([2.0, 1.0, 0.0, 3.0]), torch.tensor([1.0, 1.0, 1.0, 2.0])) == 0.625


def test_without_a_judge_only_the_rm_judges():
    m = compare(gens([2.0, 0.0, 1.0]), gens([1.0, 1.0, 1.0]))
    assert m["rm_win_rate_vs_sft"] == 0.5  # (1 + 0 + 0.5) / 3
    assert m["win_rate_vs_sft"] is None and m["gold_reward_mean"] is None and m["gold_reward_mean_sft"] is None
    assert m["reward_mean"] == 1.0 and m["reward_mean_sft"] == 1.0


def test_with_a_judge_both_are_reported():
    m = compare(gens([2.0, 0.0], gold=[0.5, 0.5]), gens([1.0, 1.0], gold=[0.0, 1.0]))
    assert m["win_rate_vs_sft"] == 0.5 and m["rm_win_rate_vs_sft"] == 0.5 and m["gold_reward_mean"] == 0.5


def test_a_prompt_asked_twice_is_one_draw_of_the_intervals():
    """The arithmetic eval asks each held-out problem several times: the replies to one prompt are resampled
    together. Prompt a's two replies score 1, prompt b's 0: every resample's mean is 0, 1/2 or 1."""
    from rlhf_lib.intervals import cluster_interval, mean_interval

    pol, sft = gens([1.0, 1.0, 0.0, 0.0]), gens([0.0, 0.0, 0.0, 0.0])
    asked = intervals(pol, sft, ["a", "a", "b", "b"])
    assert asked["reward_mean"] == cluster_interval([1, 1, 0, 0], ["a", "a", "b", "b"]) == (0.0, 1.0)
    assert asked["rm_win_rate_vs_sft"] == (0.5, 1.0)  # a wins (1), b ties (0.5)
    assert asked["reward_lead_over_sft"] == (0.0, 1.0)  # a leads by 1, b by 0
    assert compare(gens([2.0, 0.0, 2.0]), gens([1.0, 1.0, 1.0]))["reward_lead_over_sft"] == pytest.approx(1 / 3)
    assert intervals(pol, sft, ["a", "b", "c", "d"])["reward_mean"] == mean_interval([1, 1, 0, 0])
    assert intervals(pol, sft)["reward_mean"] == mean_interval([1, 1, 0, 0])


def test_best_of_n_keeps_the_top_scored_of_the_first_n_draws(tiny_tokenizer, tiny_policy):
    """Hand check of `best_of_n`: draw k is `generate_and_score` seeded eval.seed + 1 + k; per prompt the kept reply
    is the argmax of the reward over the first n draws, and PPO's lead is its gold minus the kept reply's."""
    import math
    from types import SimpleNamespace

    from rlhf_lib.config import EvalConfig
    from rlhf_lib.eval import best_of_n, generate_and_score
    from rlhf_lib.lm.generation import decode_responses

    tok = tiny_tokenizer

    def rewards(prompts, q, qm, r, rm):  # a stand-in reward source: the reply's length in characters
        total = torch.tensor([float(len(t)) for t in decode_responses(tok, r, rm)])
        return SimpleNamespace(total=total, parts={"rm": total})

    def judge(prompt, text):  # a stand-in gold judge: how many "topic" words
        return float(text.count("topic"))

    prompts = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(5)]
    cfg = EvalConfig(max_new_tokens=6, temperature=1.0, best_of=[2, 3], best_of_prompts=4, batch_size=2)
    draws = [generate_and_score(tiny_policy, tiny_policy, rewards, tok, prompts[:4],
                                cfg.model_copy(update={"seed": cfg.seed + 1 + k}), 32, judge) for k in range(3)]
    policy = generate_and_score(tiny_policy, tiny_policy, rewards, tok, prompts, cfg, 32, judge)
    got, bounds, picks = best_of_n(tiny_policy, rewards, tok, prompts, cfg, 32, judge, None, policy)
    assert got["best_of_prompts"] == 4.0
    for n in (2, 3):
        kept = [max(range(n), key=lambda k: (float(draws[k].scores[i]), -k)) for i in range(4)]  # first of equals
        gold = [draws[k].gold[i] for i, k in enumerate(kept)]
        assert got[f"best_of_{n}_reward_mean"] == pytest.approx(sum(float(draws[k].scores[i])
                                                                     for i, k in enumerate(kept)) / 4)
        assert got[f"best_of_{n}_gold_mean"] == pytest.approx(sum(gold) / 4)
        assert got[f"gold_lead_over_best_of_{n}"] == pytest.approx(sum(policy.gold[i] - gold[i] for i in range(4)) / 4)
        assert got[f"best_of_{n}_kl"] == pytest.approx(math.log(n) - (n - 1) / n)
        assert [p["response"] for p in picks[n]] == [draws[k].texts[i] for i, k in enumerate(kept)]
        assert [p["gold"] for p in picks[n]] == pytest.approx(gold, abs=1e-4)
        lo, hi = bounds[f"gold_lead_over_best_of_{n}"]
        assert lo <= got[f"gold_lead_over_best_of_{n}"] <= hi
    # another sampled policy (the DPO arm) meets each best-of-n on the same 4 prompts, as PPO does
    arm = gens([0.0] * 5, gold=[1.0, 0.0, 0.0, 0.0, 9.0])
    with_arm, _, _ = best_of_n(tiny_policy, rewards, tok, prompts, cfg, 32, judge, None, policy, arms={"dpo": arm})
    for n in (2, 3):
        kept = [max(range(n), key=lambda k: (float(draws[k].scores[i]), -k)) for i in range(4)]
        gold = [draws[k].gold[i] for i, k in enumerate(kept)]
        assert with_arm[f"dpo_gold_lead_over_best_of_{n}"] == pytest.approx(
            sum(arm.gold[i] - gold[i] for i in range(4)) / 4)  # the fifth prompt (gold 9) has no best-of-n
        assert with_arm[f"gold_lead_over_best_of_{n}"] == got[f"gold_lead_over_best_of_{n}"]


def test_the_kl_to_itself_is_zero_and_a_copy_agrees_to_rounding(tiny_tokenizer, tiny_policy):
    """A model scored against itself (SFT, best-of-n's draws) skips the reference forward: its KL is exactly 0. A
    separate copy, which runs that forward, agrees within float rounding; a perturbed copy does not."""
    import copy
    from types import SimpleNamespace

    from rlhf_lib.config import EvalConfig
    from rlhf_lib.eval import generate_and_score

    def rewards(prompts, q, qm, r, rm):
        total = torch.zeros(r.shape[0])
        return SimpleNamespace(total=total, parts={"rm": total})

    prompts = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(4)]
    cfg = EvalConfig(max_new_tokens=6, temperature=0.7, batch_size=2)
    own = generate_and_score(tiny_policy, tiny_policy, rewards, tiny_tokenizer, prompts, cfg, 32, None)
    assert own.kl_to_ref.tolist() == [0.0] * 4
    twin = copy.deepcopy(tiny_policy)
    same = generate_and_score(tiny_policy, twin, rewards, tiny_tokenizer, prompts, cfg, 32, None)
    assert same.texts == own.texts and torch.allclose(same.kl_to_ref, own.kl_to_ref, atol=1e-4)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = generate_and_score(tiny_policy, twin, rewards, tiny_tokenizer, prompts, cfg, 32, None)
    assert moved.kl_to_ref.abs().sum() > 1e-2


def test_a_memo_serves_the_sft_side_and_the_policy_is_sampled_afresh(tiny_tokenizer, tiny_policy):
    """`evaluate(memo=...)`: the SFT model's replies (seed eval.seed) and each best-of-n draw (seed eval.seed + 1 + k)
    come from the memo when it holds them. A perturbed SFT model served by the memo gives the first eval's SFT figures
    exactly; the policy side is sampled again."""
    import copy
    from types import SimpleNamespace

    from rlhf_lib.config import EvalConfig
    from rlhf_lib.eval import evaluate

    def rewards(prompts, q, qm, r, rm):
        total = rm.sum(1).float() + r[:, 0].float() / 1000  # length, tie-broken by the first token
        return SimpleNamespace(total=total, parts={"rm": total})

    store: dict = {}

    def memo(seed, prompts, compute):
        key = (seed, tuple(prompts))
        if key not in store:
            store[key] = compute()
        return store[key]

    prompts = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(3)]
    cfg = EvalConfig(max_new_tokens=6, temperature=1.0, best_of=[2], best_of_prompts=2, batch_size=2)
    first = evaluate(tiny_policy, tiny_policy, rewards, tiny_tokenizer, prompts, cfg, 32, memo=memo)
    assert sorted(store) == [(cfg.seed, tuple(prompts)), (cfg.seed + 1, tuple(prompts[:2])),
                             (cfg.seed + 2, tuple(prompts[:2]))]
    moved = copy.deepcopy(tiny_policy)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.5 * torch.randn_like(p))
    served = evaluate(tiny_policy, moved, rewards, tiny_tokenizer, prompts, cfg, 32, memo=memo)
    fresh = evaluate(tiny_policy, moved, rewards, tiny_tokenizer, prompts, cfg, 32)
    sft_keys = ("reward_mean_sft", "response_length_mean_sft", "best_of_2_reward_mean")
    assert [served.metrics[k] for k in sft_keys] == [first.metrics[k] for k in sft_keys]
    assert [fresh.metrics[k] for k in sft_keys] != [first.metrics[k] for k in sft_keys]  # the memo mattered
    assert served.metrics["reward_mean"] == first.metrics["reward_mean"]  # the same policy, the same seed
    assert served.metrics["kl_to_ref"] != first.metrics["kl_to_ref"]  # its KL is to the moved model: not memoised


def test_ppo_against_a_control_arm_is_paired_prompt_by_prompt():
    """`versus`: PPO [2, 0, 1] against a control [1, 1, 1] on the same prompts, gold PPO [1, 0, 2], control [0, 1, 0],
    SFT [0, 0, 0]. Hand-computed: reward lead (1 - 1 + 0) / 3 = 0; gold lead (1 - 1 + 2) / 3 = 2/3; the judge's win
    rate of PPO over the control (1 + 0 + 1) / 3; the control's over SFT (0.5 + 1 + 0.5) / 3."""
    from rlhf_lib.eval import versus

    pol, arm, sft = gens([2.0, 0.0, 1.0], gold=[1.0, 0.0, 2.0]), gens([1.0, 1.0, 1.0], gold=[0.0, 1.0, 0.0]), \
        gens([0.0, 0.0, 0.0], gold=[0.0, 0.0, 0.0])
    rows = versus(pol, arm, sft, "zero_reward")
    mean = {k: sum(v) / len(v) for k, v in rows.items()}
    assert mean["reward_lead_over_zero_reward"] == pytest.approx(0.0)
    assert mean["gold_lead_over_zero_reward"] == pytest.approx(2 / 3)
    assert mean["win_rate_vs_zero_reward"] == pytest.approx(2 / 3)
    assert mean["rm_win_rate_vs_zero_reward"] == pytest.approx(0.5)  # win, loss, tie
    assert mean["zero_reward_win_rate_vs_sft"] == pytest.approx(2 / 3)
    assert mean["zero_reward_rm_win_rate_vs_sft"] == 1.0  # the reward sources: 1 > 0 on every prompt
    assert mean["zero_reward_gold_reward_mean"] == pytest.approx(1 / 3)
    assert mean["zero_reward_reward_mean"] == 1.0 and mean["zero_reward_response_length_mean"] == 4.0
    no_judge = versus(gens([2.0, 0.0]), gens([1.0, 1.0]), gens([0.0, 0.0]), "shuffled_reward")
    assert "gold_lead_over_shuffled_reward" not in no_judge and no_judge["reward_lead_over_shuffled_reward"] == [1, -1]


def test_a_control_arms_sources_are_compared_one_by_one():
    from rlhf_lib.eval import versus

    pol, arm = gens([1.0, 1.0]), gens([0.0, 1.0])
    pol.parts = {"rm": torch.tensor([0.5, 0.5]), "exact": torch.tensor([1.0, 0.0])}
    arm.parts = {"rm": torch.tensor([0.0, 0.5]), "exact": torch.tensor([0.0, 1.0])}
    rows = versus(pol, arm, gens([0.0, 0.0]), "zero_reward")
    assert rows["reward_exact_lead_over_zero_reward"] == [1.0, -1.0]
    assert rows["reward_rm_lead_over_zero_reward"] == [0.5, 0.0]


def test_best_of_n_ranks_by_the_score_ppo_is_shaped_with():
    """With PPO's missing-EOS penalty 1, a reply scored 2.5 without EOS ranks below one scored 2 with it; without
    the penalty it ranks above."""
    from rlhf_lib.eval_best_of import shaped_pick_scores

    scores = torch.tensor([[2.0, 2.5], [1.0, 0.0]])
    has_eos = torch.tensor([[True, False], [False, True]])
    assert shaped_pick_scores(scores, has_eos, 1.0).tolist() == [[2.0, 1.5], [0.0, 0.0]]
    assert shaped_pick_scores(scores, has_eos, 1.0).argmax(1).tolist() == [0, 0]  # the first of equals
    assert shaped_pick_scores(scores, has_eos, None).argmax(1).tolist() == [1, 0]
    assert shaped_pick_scores(scores, has_eos, 0.0) is scores


def test_two_policies_head_to_head_by_hand():
    """`head_to_head`: a [2, 0, 1] against b [1, 1, 1], gold a [1, 0, 2], b [0, 1, 2]. Reward lead (1 - 1 + 0) / 3 = 0;
    reward win rate (1 + 0 + 0.5) / 3 = 0.5; gold lead (1 - 1 + 0) / 3 = 0; the judge's win rate (1 + 0 + 0.5) / 3;
    on the first 2 prompts only: gold win rate (1 + 0) / 2. Without gold on one side: the reward rows only."""
    from rlhf_lib.eval_pairs import head_to_head

    a, b = gens([2.0, 0.0, 1.0], gold=[1.0, 0.0, 2.0]), gens([1.0, 1.0, 1.0], gold=[0.0, 1.0, 2.0])
    rows = head_to_head(a, b, "dpo_", "zero_reward")
    mean = {k: sum(v) / len(v) for k, v in rows.items()}
    assert mean == pytest.approx({"dpo_reward_lead_over_zero_reward": 0.0, "dpo_rm_win_rate_vs_zero_reward": 0.5,
                                  "dpo_gold_lead_over_zero_reward": 0.0, "dpo_win_rate_vs_zero_reward": 0.5})
    assert head_to_head(a, b, "", "x", upto=2)["win_rate_vs_x"] == [1.0, 0.0]
    assert sorted(head_to_head(a, gens([1.0, 1.0, 1.0]), "", "x")) == ["reward_lead_over_x", "rm_win_rate_vs_x"]


def test_every_arm_meets_every_later_arm_once():
    from rlhf_lib.eval_pairs import arms_head_to_head

    arms = {"zero_reward": gens([0.0, 1.0], gold=[0.0, 0.0]), "shuffled_reward": gens([1.0, 1.0], gold=[1.0, 0.0]),
            "dpo": gens([2.0, 0.0], gold=[0.0, 1.0])}
    rows = arms_head_to_head(arms)
    wins = {k: sum(v) / len(v) for k, v in rows.items() if "_win_rate_vs_" in k and "rm_win" not in k}
    assert wins == {"zero_reward_win_rate_vs_shuffled_reward": 0.25, "zero_reward_win_rate_vs_dpo": 0.25,
                    "shuffled_reward_win_rate_vs_dpo": 0.5}
    assert arms_head_to_head({"dpo": arms["dpo"]}) == {}
