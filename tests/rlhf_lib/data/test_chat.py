"""Messages: checked, and rendered with the tokenizer's chat template when it has one, else as HH transcripts."""

from __future__ import annotations

import pytest

from rlhf_lib.data import DataError
from rlhf_lib.data.chat import Renderer, check_messages
from rlhf_lib.data.fields import Fields
from rlhf_lib.data.formats import parse_preference
from rlhf_lib.models import load_tokenizer

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
CONV = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]


@pytest.fixture()
def templated_dir(tiny_tokenizer, tmp_path):
    """A local tokenizer directory (save_pretrained) whose tokenizer has a chat template."""
    tiny_tokenizer.save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)  # a copy: the session's tokenizer stays without a template
    tok.chat_template = TEMPLATE
    tok.save_pretrained(tmp_path)
    return tmp_path


def test_hh_rendering_without_a_template():
    r = Renderer()
    assert r.prompt(CONV, "prompt") == "\n\nSystem: Be kind.\n\nHuman: hi\n\nAssistant:"
    assert r.response("Hello") == " Hello" and r.response(" Hello") == " Hello"
    assert r.used == "hh"


def test_a_tokenizer_without_a_template_renders_hh(tiny_tokenizer):
    r = Renderer(lambda: tiny_tokenizer)
    assert r.prompt(CONV[1:], "prompt") == "\n\nHuman: hi\n\nAssistant:" and r.used == "hh"


def test_the_chat_template_of_a_local_tokenizer_is_applied(templated_dir):
    loads = []
    r = Renderer(lambda: loads.append(1) or load_tokenizer(templated_dir))
    assert r.used is None and loads == []  # nothing loaded before the first conversational row
    assert r.prompt(CONV, "prompt") == "<|system|>Be kind.\n<|user|>hi\n<|assistant|>"
    assert r.response("Hello") == "Hello"  # the template's own separator precedes the reply
    ex = parse_preference("conversational", Fields({"chosen": CONV + [{"role": "assistant", "content": "a"}],
                                                    "rejected": CONV + [{"role": "assistant", "content": "b"}]}), r)
    assert ex.prompt == "<|system|>Be kind.\n<|user|>hi\n<|assistant|>" and ex.responses == ("a", "b")
    assert r.used == "chat_template" and loads == [1]  # loaded once


def test_a_template_error_is_a_bad_row(templated_dir):
    tok = load_tokenizer(templated_dir)
    tok.chat_template = "{{ raise_exception('no system role') }}"
    with pytest.raises(DataError, match="chat template refused it") as info:
        Renderer(lambda: tok).prompt(CONV, "prompt")
    assert info.value.kind == "chat template"


@pytest.mark.parametrize(("value", "match"), [
    ("hi", "expected a list of messages"), ([], "an empty list"), (["hi"], "item 0 is string"),
    ([{"role": "user"}], "missing 'content'"), ([{"role": 1, "content": "x"}], "'role' is int"),
    ([{"role": "user", "content": " "}], "empty"),
])
def test_check_messages(value, match):
    with pytest.raises(DataError, match=match):
        check_messages(value, "messages")


def test_check_messages_keeps_role_and_content_only():
    assert check_messages([{"role": "user", "content": "x", "name": "bob"}], "m") == [{"role": "user", "content": "x"}]


# data.render: HH transcripts and plain prompts become messages under a chat template (issue: real models first).
HH_ROW = {"chosen": "\n\nHuman: hi\n\nAssistant: Hello!\n\nHuman: and you?\n\nAssistant: Fine, thanks.",
          "rejected": "\n\nHuman: hi\n\nAssistant: Hello!\n\nHuman: and you?\n\nAssistant: Go away."}


def test_hh_transcripts_go_through_the_chat_template(templated_dir):
    r = Renderer(lambda: load_tokenizer(templated_dir))
    ex = parse_preference("hh", Fields(HH_ROW), r)
    assert ex.prompt == "<|user|>hi\n<|assistant|>Hello!\n<|user|>and you?\n<|assistant|>"
    assert ex.responses == ("Fine, thanks.", "Go away.") and r.used == "chat_template"
    plain = parse_preference("standard", Fields({"prompt": "Tips?", "chosen": "Rest.", "rejected": "No."}), r)
    assert plain.prompt == "<|user|>Tips?\n<|assistant|>" and plain.responses == ("Rest.", "No.")


def test_render_text_keeps_hh_text_even_with_a_template(templated_dir):
    r = Renderer(lambda: load_tokenizer(templated_dir), mode="text")
    ex = parse_preference("hh", Fields(HH_ROW), r)
    assert ex.prompt == "\n\nHuman: hi\n\nAssistant: Hello!\n\nHuman: and you?\n\nAssistant:"
    assert ex.responses == (" Fine, thanks.", " Go away.")


def test_render_chat_template_refuses_a_tokenizer_without_one(tiny_tokenizer):
    r = Renderer(lambda: tiny_tokenizer, mode="chat_template")
    with pytest.raises(DataError, match="data.render=chat_template: the policy's tokenizer has no chat template"):
        r.templated()
    with pytest.raises(DataError, match="data.render=chat_template"):  # every time, not only the first
        r.templated()


def test_an_sft_transcript_is_split_and_templated(templated_dir):
    from rlhf_lib.data.formats import parse_sft

    r = Renderer(lambda: load_tokenizer(templated_dir))
    ex = parse_sft("text", Fields({"text": HH_ROW["chosen"]}), r)
    assert ex.prompt.endswith("<|user|>and you?\n<|assistant|>") and ex.response == "Fine, thanks."


def test_an_hh_prompt_string_becomes_turns_like_the_hh_preferences(templated_dir):
    from rlhf_lib.data.formats import parse_prompt

    r = Renderer(lambda: load_tokenizer(templated_dir))
    prompt = parse_prompt("prompt", Fields({"prompt": "\n\nHuman: hi\n\nAssistant: Hello!\n\nHuman: and you?"
                                                      "\n\nAssistant:"}), r).prompt
    assert prompt == parse_preference("hh", Fields(HH_ROW), r).prompt  # the same text: held-out filtering holds


def test_plain_text_data_is_not_said_to_be_rendered(tiny_tokenizer):
    from rlhf_lib.data.formats import parse_prompt

    r = Renderer(lambda: tiny_tokenizer)
    assert parse_prompt("prompt", Fields({"prompt": "Q?"}), r).prompt == "Q?" and r.used is None
