"""Slots of the demo task: topics (each with one keyword and a fact bank), ask forms, human tones, and the split.

A prompt is `"\\n\\nHuman: <tone><ask about topic>\\n\\nAssistant:"`, the Anthropic HH transcript format, so user
data in that format and the demo task go through the same code. Every topic has a single distinctive keyword that
appears in the prompt and in each of its facts: the gold judge recovers the topic from the prompt text alone and
detects on/off-topic responses by keyword, so it can score any text the policy writes.

The split (docs/data.md, "Splits") holds out what the judge reads, not only wording: train, validation and test
each get their own topics (`TEST_TOPICS`, `VAL_TOPICS`: never a word of any training file), and the (topic, ask)
combinations held out of the training topics are shared between validation and test. The generator keeps one fact
template and two openers out of training too (`HELDOUT_FACT_TEMPLATES` here, `responses.HELDOUT_OPENERS`). The split
does not depend on the data seed, so eval prompts of runs with different seeds stay comparable.
"""

from __future__ import annotations

import re

# One keyword per topic, lower case everywhere it appears (a capitalised keyword is a different BPE token).
# Activities, so that every fact template reads naturally for every topic.
TOPIC_NAMES: tuple[str, ...] = (
    "cycling", "gardening", "baking", "running", "chess", "guitar", "camping",
    "painting", "swimming", "knitting", "yoga", "fishing", "hiking", "dancing",
)

# Facts are topic-specific sentences built from shared templates. Why templates: the pipeline's tokenizer is a
# byte-level BPE with 512 tokens, i.e. only ~254 merges; 70 free-form facts would need hundreds of rare words, each
# split into many tokens, and the best response would no longer fit in max_new_tokens = 32. With templates every
# word of a good response is frequent enough to become one token (best responses ~ 20 words ~ 28 tokens). A fact
# still belongs to one topic (its keyword), so "on-topic detail" means: the right keyword in the right advice.
FACT_TEMPLATES: tuple[str, ...] = (
    "Learn the {k} basics first.",
    "Get good {k} gear.",
    "Join a local {k} club.",
    "Practice {k} every week.",
    "Go slow with {k} at first.",
)
TOPICS: dict[str, tuple[str, ...]] = {k: tuple(t.format(k=k) for t in FACT_TEMPLATES) for k in TOPIC_NAMES}
# Held out of training (docs/data.md, "Splits"): whole topics (their keyword never appears in a training file, not
# even off-topic) and a fact template (validation and test responses use it; the judge credits it as any fact).
TEST_TOPICS: tuple[str, ...] = ("hiking", "knitting")
VAL_TOPICS: tuple[str, ...] = ("fishing", "painting")
HELDOUT_FACT_TEMPLATES: tuple[str, ...] = ("Go slow with {k} at first.",)
SPLITS: tuple[str, ...] = ("train", "validation", "test")

ASKS: tuple[str, ...] = (
    "How do I start {t}?",
    "Any tips about {t}?",
    "What should I know about {t}?",
    "Can you help me with {t}?",
    "Where do I begin with {t}?",
    "Any advice on {t}?",
)

# The human's tone only varies the surface of the prompt; the judge ignores it.
TONES: tuple[str, ...] = ("", "Hi! ", "Hello. ", "Quick question: ")

Combo = tuple[str, int]  # (topic keyword, ask index)


def make_prompt(topic: str, ask: int, tone: int = 0) -> str:
    """Render one prompt in the HH transcript format."""
    return f"\n\nHuman: {TONES[tone]}{ASKS[ask].format(t=topic)}\n\nAssistant:"


def _combo_split() -> dict[str, frozenset[Combo]]:
    """train / validation / test: the held-out topics whole, and the training topics' held-out asks.

    Training topic i holds out ask i mod 6 (a Latin-square diagonal, so every ask is held out for some topic), and
    every third one also ask (i + 3) mod 6; these combinations go alternately to test and validation. Each training
    topic keeps >= 4 ask forms and each ask form >= 6 topics in training.
    """
    n = len(ASKS)
    train_topics = [t for t in TOPIC_NAMES if t not in TEST_TOPICS + VAL_TOPICS]
    held: list[Combo] = []
    for i, topic in enumerate(train_topics):
        held.append((topic, i % n))
        if i % 3 == 0:
            held.append((topic, (i + 3) % n))
    every = {(t, a) for t in train_topics for a in range(n)}
    return {
        "train": frozenset(every - set(held)),
        "validation": frozenset(held[1::2]) | {(t, a) for t in VAL_TOPICS for a in range(n)},
        "test": frozenset(held[0::2]) | {(t, a) for t in TEST_TOPICS for a in range(n)},
    }


def split_combos(split: str) -> frozenset[Combo]:
    """The (topic, ask) combinations of `split`: "train", "validation" or "test"."""
    return _combo_split()[split]


def held_out_combos() -> frozenset[Combo]:
    """Every combination kept out of training: validation and test."""
    return split_combos("validation") | split_combos("test")


def train_combos() -> frozenset[Combo]:
    """The combinations of the training split."""
    return split_combos("train")


def topics_of(split: str) -> tuple[str, ...]:
    """The topics a response of `split` may talk about (off-topic ones too): training never names a held-out one."""
    return tuple(t for t in TOPIC_NAMES if split != "train" or t not in TEST_TOPICS + VAL_TOPICS)


def facts_of(topic: str, split: str = "test") -> tuple[str, ...]:
    """The facts of `topic` a response of `split` may state: training never uses `HELDOUT_FACT_TEMPLATES`."""
    return tuple(t.format(k=topic) for t in FACT_TEMPLATES
                 if split != "train" or t not in HELDOUT_FACT_TEMPLATES)


def prompts_for(combos: frozenset[Combo]) -> list[str]:
    """Every distinct prompt (all tones) of the given combinations, in a fixed order."""
    return [make_prompt(t, a, k) for (t, a) in sorted(combos) for k in range(len(TONES))]


_PROMPT_SLOTS: dict[str, tuple[str, int, int]] = {
    make_prompt(t, a, k): (t, a, k) for t in TOPIC_NAMES for a in range(len(ASKS)) for k in range(len(TONES))
}


def prompt_slots(prompt: str) -> tuple[str, int, int] | None:
    """(topic, ask, tone) of a demo prompt, or None for any other text."""
    return _PROMPT_SLOTS.get(prompt)


_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    """Lower-cased word tokens; anything else (punctuation, non-ASCII letters) separates them."""
    return _WORD.findall(text.lower())


def parse_topic(prompt: str) -> str | None:
    """The topic keyword of the last human turn of `prompt` (the first keyword in it), or None.

    Only the last human turn counts, so a multi-turn transcript is judged on its current question; without any
    "Human:" marker the whole text is searched.
    """
    start = prompt.rfind("Human:")
    segment = prompt[start:] if start >= 0 else prompt
    end = segment.find("Assistant:")
    if end >= 0:
        segment = segment[:end]
    for w in words(segment):
        if w in TOPICS:
            return w
    return None
