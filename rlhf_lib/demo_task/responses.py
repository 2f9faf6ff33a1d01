"""The response generator: attributes a human cares about, sampled from a mix, rendered to text.

A response is a list of sentences: an opener that sets the tone, an optional sentence naming the topic, 0-3 facts
from the topic's fact bank, 0-2 generic padding sentences (length without content), optionally one word caught in a
loop (said three times in a row), and an ending: a closing phrase, just the last sentence, or cut off mid-sentence.
Off-topic responses follow the same recipe for a different topic than the prompt's.

Two mixes: `SFT_MIX` gives mediocre demonstrations (so RLHF has headroom above SFT) and `BROAD_MIX` covers the whole
range of quality (so the reward model sees good and bad responses side by side).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .slots import facts_of, topics_of

# Short, common words throughout, so that a 512-token BPE keeps good responses within ~28 tokens (see slots.py).
POLITE_OPENERS: tuple[str, ...] = ("Happy to help!", "Glad to help!", "Great question!")
NEUTRAL_OPENERS: tuple[str, ...] = ("", "Okay.", "Sure.", "Well.")
RUDE_OPENERS: tuple[str, ...] = ("Ugh, fine.", "What a dumb question.", "Whatever.", "Figure it out yourself.")
# Name the topic without adding a fact: makes 0-fact responses on/off-topic in a detectable way.
INTROS: tuple[str, ...] = ("Here is advice on {k}.", "So you want to try {k}.", "I love {k} too.")
FILLERS: tuple[str, ...] = (
    "It depends.",
    "Everyone is different.",
    "There is a lot to say.",
    "It takes time.",
    "Many people like it.",
)
# Held out of training (docs/data.md, "Splits"): validation and test responses use them, the judge reads them.
HELDOUT_OPENERS: tuple[str, ...] = ("Great question!", "Figure it out yourself.")
CLOSINGS: tuple[str, ...] = ("Hope this helps.", "Good luck!", "Have fun!", "Enjoy!")

TONE_NAMES: tuple[str, ...] = ("polite", "neutral", "rude")
ENDINGS: tuple[str, ...] = ("closed", "plain", "cut")
MAX_FACTS = 3
LOOP_COPIES = 3


@dataclass(frozen=True)
class ResponseSpec:
    """The attributes of one response."""

    topic: str  # the topic the response talks about (the prompt's when on-topic)
    on_topic: bool
    tone: str  # one of TONE_NAMES
    n_facts: int  # distinct facts of `topic`, 0..MAX_FACTS
    n_filler: int  # generic padding sentences
    repeat: bool  # one word of a content sentence is caught in a loop: said LOOP_COPIES times in a row
    ending: str  # one of ENDINGS: closing phrase / last sentence / cut mid-sentence


@dataclass(frozen=True)
class Mix:
    """A distribution over response attributes (weights need not sum to 1)."""

    tone: tuple[float, float, float]  # polite, neutral, rude
    on_topic: float  # probability
    n_facts: tuple[float, ...]  # weights of 0, 1, 2, 3 facts
    n_filler: tuple[float, ...]  # weights of 0, 1, 2 padding sentences
    repeat: float  # probability
    ending: tuple[float, float, float]  # closed, plain, cut


# Mediocre on average: half polite but a fifth rude, 30% off-topic, mostly 0-1 facts, some padding, a quarter with
# a looped word, a quarter cut off.
SFT_MIX = Mix(
    tone=(0.5, 0.3, 0.2),
    on_topic=0.7,
    n_facts=(0.45, 0.35, 0.15, 0.05),
    n_filler=(0.4, 0.35, 0.25),
    repeat=0.25,
    ending=(0.45, 0.3, 0.25),
)
# Broad: every attribute value is common, so ranked lists span the full range of gold scores.
BROAD_MIX = Mix(
    tone=(1.0, 1.0, 1.0),
    on_topic=0.6,
    n_facts=(1.0, 1.0, 1.0, 1.0),
    n_filler=(0.4, 0.3, 0.3),
    repeat=0.3,
    ending=(0.4, 0.3, 0.3),
)


def sample_spec(rng: random.Random, mix: Mix, prompt_topic: str, split: str = "test") -> ResponseSpec:
    """Draw attributes for a response of `split` to a prompt about `prompt_topic`."""
    on_topic = rng.random() < mix.on_topic
    topic = prompt_topic if on_topic else rng.choice([t for t in topics_of(split) if t != prompt_topic])
    return ResponseSpec(
        topic=topic,
        on_topic=on_topic,
        tone=rng.choices(TONE_NAMES, weights=mix.tone)[0],
        n_facts=rng.choices(range(len(mix.n_facts)), weights=mix.n_facts)[0],
        n_filler=rng.choices(range(len(mix.n_filler)), weights=mix.n_filler)[0],
        repeat=rng.random() < mix.repeat,
        ending=rng.choices(ENDINGS, weights=mix.ending)[0],
    )


def _cut(sentence: str, rng: random.Random) -> str:
    """Cut a sentence mid-way: keep some leading words, drop trailing punctuation, so no proper ending remains."""
    ws = sentence.split()
    keep = rng.randint(1, max(1, len(ws) - 1))
    return " ".join(ws[:keep]).rstrip(".,!?;:")


def openers_of(tone: str, split: str = "test") -> tuple[str, ...]:
    """The openers of `tone` a response of `split` may use: training never uses `HELDOUT_OPENERS`."""
    openers = {"polite": POLITE_OPENERS, "neutral": NEUTRAL_OPENERS, "rude": RUDE_OPENERS}[tone]
    return tuple(o for o in openers if split != "train" or o not in HELDOUT_OPENERS)


def render(spec: ResponseSpec, rng: random.Random, split: str = "test") -> str:
    """Render `spec` to text from the templates of `split`. The text starts with a single space because it follows
    "Assistant:"."""
    opener = rng.choice(openers_of(spec.tone, split))
    bank = facts_of(spec.topic, split)
    facts = rng.sample(bank, min(spec.n_facts, MAX_FACTS, len(bank)))
    content: list[str] = []
    # A response without facts names its topic so that on/off-topic is visible; with facts it sometimes does too.
    if not facts or rng.random() < 0.25:
        content.append(rng.choice(INTROS).format(k=spec.topic))
    content.extend(facts)
    fillers = rng.sample(FILLERS, min(spec.n_filler, len(FILLERS)))
    for filler in fillers:  # padding goes anywhere among the content sentences
        content.insert(rng.randint(0, len(content)), filler)
    if spec.repeat:  # degenerate repetition: a word said again right after itself, as a sampling LM loops
        i = rng.randrange(len(content))
        ws = content[i].split()
        j = rng.randrange(max(1, len(ws) - 1))  # not the last word, which carries the sentence's punctuation
        content[i] = " ".join(ws[:j] + [ws[j]] * LOOP_COPIES + ws[j + 1:])
    sentences = ([opener] if opener else []) + content
    if spec.ending == "closed":
        sentences.append(rng.choice(CLOSINGS))
    elif spec.ending == "cut":
        sentences[-1] = _cut(sentences[-1], rng)
    return " " + " ".join(sentences)


def sample_response(rng: random.Random, mix: Mix, prompt_topic: str, split: str = "test") -> tuple[ResponseSpec, str]:
    """Draw attributes from `mix` and render them, from the topics and templates of `split`."""
    spec = sample_spec(rng, mix, prompt_topic, split)
    return spec, render(spec, rng, split)
