"""Slots of the demo task: topics (each with one keyword and a fact bank), ask forms, human tones, and the split.

A prompt is `"\\n\\nHuman: <tone><ask about topic>\\n\\nAssistant:"`, the Anthropic HH transcript format, so user
data in that format and the demo task go through the same code. Every topic has a single distinctive keyword that
appears in the prompt and in each of its facts: the gold judge recovers the topic from the prompt text alone and
detects on/off-topic responses by keyword, so it can score any text the policy writes.

The split is over (topic, ask) combinations: every topic and every ask form appears in training, but the held-out
combinations never do, so eval measures generalisation to new combinations rather than memorised prompts. It does
not depend on the data seed, so eval prompts of runs with different seeds stay comparable.
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


def held_out_combos() -> frozenset[Combo]:
    """(topic, ask) combinations reserved for eval: 19 of 84 (~23%).

    Topic i holds out ask i mod 6 (a Latin-square diagonal, so every ask is held out for some topic), and every
    third topic also holds out ask (i + 3) mod 6. Each topic keeps >= 4 ask forms and each ask form >= 9 topics in
    training, so nothing about the held-out combos is unseen on its own.
    """
    n = len(ASKS)
    out = set()
    for i, topic in enumerate(TOPIC_NAMES):
        out.add((topic, i % n))
        if i % 3 == 0:
            out.add((topic, (i + 3) % n))
    return frozenset(out)


def train_combos() -> frozenset[Combo]:
    """All (topic, ask) combinations not held out."""
    every = {(t, a) for t in TOPIC_NAMES for a in range(len(ASKS))}
    return frozenset(every - held_out_combos())


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
