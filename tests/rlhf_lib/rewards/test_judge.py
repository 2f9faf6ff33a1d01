"""A judge language model's score from its next-token probabilities (rlhf_lib/rewards/judge.py): hand-computed
P(yes) and expected rating, batching and left padding, and the refusals that name the source."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.config import ConfigError, build_config
from rlhf_lib.config.rewards import RewardSource
from rlhf_lib.rewards.base import RewardError, TextBatch
from rlhf_lib.rewards.combine import RewardSet
from rlhf_lib.rewards.judge import JudgeReward, check_judge, rating_tokens, render_rubric, yes_no_tokens

TEMPLATE = "Good? {prompt} / {response}"
PROMPTS = ["topic 3", "tell me about topic 12"]
REPLIES = ["Sure, topic 3 is nice.", "Thanks!"]


def _last_probs(model, tokenizer, prompt, reply, template=TEMPLATE):
    ids = tokenizer(render_rubric(tokenizer, template, prompt, reply), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return torch.softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)


def test_yes_probability_by_hand_and_batched(tiny_tokenizer, tiny_policy):
    judge = JudgeReward(tiny_policy, tiny_tokenizer, TEMPLATE, batch_size=2)
    yes, no = yes_no_tokens(tiny_tokenizer, "x")
    expected = []
    for p, r in zip(PROMPTS, REPLIES):
        probs = _last_probs(tiny_policy, tiny_tokenizer, p, r)
        expected.append(float(probs[yes].sum() / (probs[yes].sum() + probs[no].sum())))
    got = judge.scores(PROMPTS, REPLIES)  # one batch of two rubrics of different lengths: left padding
    assert got.tolist() == pytest.approx(expected, abs=1e-5)
    assert all(0.0 <= s <= 1.0 for s in got.tolist())
    alone = JudgeReward(tiny_policy, tiny_tokenizer, TEMPLATE, batch_size=1).scores(PROMPTS, REPLIES)
    assert alone.tolist() == pytest.approx(got.tolist(), abs=1e-5)
    assert judge(TextBatch(PROMPTS, REPLIES, [True, True])) == pytest.approx(got.tolist())


def test_expected_rating_by_hand(tiny_tokenizer, tiny_policy):
    template = "Rate 1 to 4: {prompt} / {response}:"
    judge = JudgeReward(tiny_policy, tiny_tokenizer, template, score="rating", rating_max=4)
    ratings = rating_tokens(tiny_tokenizer, 4, "x")
    probs = _last_probs(tiny_policy, tiny_tokenizer, PROMPTS[0], REPLIES[0], template)[ratings]
    expected = float((probs * torch.arange(1, 5)).sum() / probs.sum())
    (got,) = judge.scores(PROMPTS[:1], REPLIES[:1]).tolist()
    assert got == pytest.approx(expected, abs=1e-5) and 1.0 <= got <= 4.0


def test_the_judge_is_frozen(tiny_tokenizer, tiny_policy):
    JudgeReward(tiny_policy, tiny_tokenizer, TEMPLATE)
    assert not any(p.requires_grad for p in tiny_policy.parameters()) and not tiny_policy.training


class _TwoTokenDigits:
    """A tokenizer stand-in whose "3" is two tokens."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [7, 8] if text == "3" else [ord(text[0])]}


def test_refusals_name_the_source(tiny_tokenizer, tiny_policy, tmp_path):
    with pytest.raises(RewardError, match="'g'.*the rating 3 is 2 tokens"):
        rating_tokens(_TwoTokenDigits(), 5, "reward 'g' (judge x)")
    with pytest.raises(RewardError, match="placeholders"):
        JudgeReward(tiny_policy, tiny_tokenizer, "no placeholders here")
    with pytest.raises(ConfigError, match=r"ppo.rewards\['j'\].template: lacks the placeholder\(s\) \{response\}"):
        build_config([], ["ppo.rewards=[{name: j, kind: judge, model: m, template: 'Q: {prompt}'}]"])
    with pytest.raises(ConfigError, match="kind judge needs template"):
        build_config([], ["ppo.rewards=[{name: j, kind: judge, model: m}]"])
    with pytest.raises(ConfigError, match="template, score does not apply to kind function|does not apply"):
        build_config([], ["ppo.rewards=[{name: f, kind: function, function: 'a.b:c', template: 'x {prompt}'}]"])
    source = RewardSource(name="j", kind="judge", model=str(tmp_path / "nowhere"), template=TEMPLATE)
    with pytest.raises(RewardError, match=r"reward 'j' \(judge .*nowhere\): cannot load the judge's tokenizer"):
        check_judge(source, tmp_path / "nowhere")


def test_a_reward_set_needs_each_judge_loaded(tiny_tokenizer, tiny_policy):
    source = RewardSource(name="j", kind="judge", model="m", template=TEMPLATE, weight=2.0)
    with pytest.raises(ValueError, match="no judge model was loaded"):
        RewardSet([source], None, tiny_tokenizer)
    judge = JudgeReward(tiny_policy, tiny_tokenizer, TEMPLATE)
    rewards = RewardSet([source], None, tiny_tokenizer, judges={"j": judge})
    enc = tiny_tokenizer(REPLIES, add_special_tokens=False, padding=True, return_tensors="pt")
    q = torch.ones((2, 3), dtype=torch.long)
    got = rewards(PROMPTS, q, torch.ones_like(q), enc["input_ids"], enc["attention_mask"])
    texts = rewards.text_batch(PROMPTS, enc["input_ids"], enc["attention_mask"]).completions
    assert got.parts["j"].tolist() == pytest.approx(judge.scores(PROMPTS, texts).tolist(), abs=1e-6)
    assert got.total.tolist() == pytest.approx((2.0 * got.parts["j"]).tolist())
