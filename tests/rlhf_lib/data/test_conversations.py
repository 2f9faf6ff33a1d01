"""The conversations behind rendered prompts, and a reward model that renders them with its own chat template."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf_lib.data import DataError
from rlhf_lib.data.chat import Renderer
from rlhf_lib.data.conversations import (
    RewardRendering,
    read_conversations,
    rendered_pairs,
    reward_rendering,
    write_conversations,
)
from rlhf_lib.data.records import PairExample
from rlhf_lib.lm.generation import encode_prompts
from rlhf_lib.models import build_policy, build_scalar_model, train_tokenizer
from rlhf_lib.reward import score_texts
from rlhf_lib.rewards.retokenize import retokenized_scores

POLICY_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}<|assistant|>{% endif %}")
RM_TEMPLATE = ("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")
HH = "\n\nHuman: hi there\n\nAssistant: Hello!\n\nHuman: tell me about topic 3\n\nAssistant:"
TURNS = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "Hello!"},
         {"role": "user", "content": "tell me about topic 3"}]


def templated(tok, template):
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def rm_tokenizer():
    corpus = [f"[USER] what about item number {i}?\n[ASSISTANT] item {i} is great, really." for i in range(60)]
    return templated(train_tokenizer(corpus, vocab_size=400), RM_TEMPLATE)


def test_the_renderer_records_each_prompts_conversation(tiny_tokenizer):
    r = Renderer(lambda: templated(tiny_tokenizer, POLICY_TEMPLATE))
    text = r.hh_prompt(HH, "prompt")
    assert text == "<|user|>hi there\n<|assistant|>Hello!\n<|user|>tell me about topic 3\n<|assistant|>"
    assert r.conversations == {text: TURNS}
    plain = r.text_prompt("Why?")
    assert r.conversations[plain] == [{"role": "user", "content": "Why?"}]


def test_without_a_template_hh_text_stays_and_its_turns_are_still_recorded(tiny_tokenizer):
    r = Renderer(lambda: tiny_tokenizer)
    assert r.hh_prompt(HH, "prompt") == HH and r.conversations[HH] == TURNS
    odd = "no markers at all"  # kept as it is, as before; nothing to record
    assert r.hh_prompt(odd, "prompt") == odd and odd not in r.conversations
    assert r.text_prompt("Why?") == "Why?" and r.conversations["Why?"] == [{"role": "user", "content": "Why?"}]


def test_the_file_round_trips_and_a_bad_row_names_file_and_line(tmp_path):
    path = write_conversations(tmp_path / "c.jsonl", {"b": TURNS, "a": TURNS[:1]})
    assert read_conversations(path) == {"a": TURNS[:1], "b": TURNS}
    assert path.read_text().splitlines()[0].startswith('{"prompt": "a"')  # sorted: bytes depend on the data only
    assert read_conversations(tmp_path / "absent.jsonl") == {}
    path.write_text(path.read_text() + '{"prompt": "c", "messages": [{"role": "user"}]}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:3: .*missing 'content'"):
        read_conversations(path)


def test_the_rm_renders_with_its_own_template(tiny_tokenizer, rm_tokenizer):
    policy = templated(tiny_tokenizer, POLICY_TEMPLATE)
    r = Renderer(lambda: policy)
    text = r.hh_prompt(HH, "prompt")
    rendering = RewardRendering(r.conversations, rm_tokenizer, "auto", policy)
    assert rendering.templated
    assert rendering.prompt(text) == "[USER] hi there\n[ASSISTANT] Hello!\n[USER] tell me about topic 3\n[ASSISTANT] "
    assert rendering.response(" Sure.") == "Sure."  # content after a template
    assert rendering.prompt("unknown prompt") == "unknown prompt" and rendering.misses == 1
    assert rendering.rendered == 1
    pair = rendered_pairs([PairExample(text, "Yes.", "No.")], rendering)[0]
    assert pair.prompt.startswith("[USER] hi there") and (pair.chosen, pair.rejected) == ("Yes.", "No.")


def test_an_rm_without_a_template_reads_hh_text(tiny_tokenizer):
    policy = templated(tiny_tokenizer, POLICY_TEMPLATE)
    r = Renderer(lambda: policy)
    text = r.hh_prompt(HH, "prompt")
    rendering = RewardRendering(r.conversations, tiny_tokenizer, "auto", policy)
    assert not rendering.templated and rendering.prompt(text) == HH
    assert rendering.response("Sure.") == " Sure."


def test_no_rendering_for_the_same_tokenizer_or_without_conversations(tiny_tokenizer, rm_tokenizer):
    assert reward_rendering({"a": TURNS}, True, rm_tokenizer) is None
    assert reward_rendering({}, False, rm_tokenizer) is None
    assert reward_rendering({"a": TURNS}, False, rm_tokenizer) is not None


def test_ppo_scores_read_the_rm_template(tiny_tokenizer, rm_tokenizer):
    """retokenized_scores with a rendering: the score of the RM-rendered prompt and reply, as score_texts gives it."""
    policy = templated(tiny_tokenizer, POLICY_TEMPLATE)
    r = Renderer(lambda: policy)
    text = r.hh_prompt(HH, "prompt")
    rendering = RewardRendering(r.conversations, rm_tokenizer, "auto", policy)
    torch.manual_seed(1)
    rm = build_scalar_model(build_policy(rm_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=128), seed=1)
    torch.nn.init.normal_(rm.score.weight, std=1.0)
    q, qm = encode_prompts(policy, [text], 96)
    ids = policy(" topic 3 is nice.", add_special_tokens=False)["input_ids"] + [policy.eos_token_id]
    resp, resp_mask = torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)
    got = retokenized_scores(rm, rm_tokenizer, policy, q, qm, resp, resp_mask, rendering=rendering)
    want = score_texts(rm, rm_tokenizer, [rendering.prompt(text)], ["topic 3 is nice."], 128)
    assert torch.allclose(got, want, atol=1e-5)
    plain = retokenized_scores(rm, rm_tokenizer, policy, q, qm, resp, resp_mask)
    assert not torch.allclose(plain, got)  # the policy's rendering reads differently
