"""The eval's SFT side remembered on this machine (`stages/eval_memo.py`): an entry is read back as it was written,
keyed by everything the SFT samples depend on and nothing they do not, and a damaged entry is sampled again."""

from __future__ import annotations

import logging

import pytest
import torch

from rlhf_lib.eval import Generations
from stages.cache import StageResult
from stages.eval_memo import SftMemo, memo_key


def gens(scale: float = 1.0) -> Generations:
    return Generations(["a reply", "another"], torch.tensor([0.5, -1.0]) * scale, torch.tensor([3.0, 7.0]),
                       torch.tensor([True, False]), torch.zeros(2), [0.25, 1.0], {"length": [1.0, 2.0]},
                       {"rm": torch.tensor([0.5, -1.0])}, None)


class Counter:
    def __init__(self, made: Generations):
        self.made, self.calls = made, 0

    def __call__(self) -> Generations:
        self.calls += 1
        return self.made


def same(a: Generations, b: Generations) -> bool:
    return (a.texts == b.texts and torch.equal(a.scores, b.scores) and torch.equal(a.lengths, b.lengths)
            and torch.equal(a.has_eos, b.has_eos) and a.gold == b.gold and a.terms == b.terms
            and a.parts.keys() == b.parts.keys() and all(torch.equal(a.parts[k], b.parts[k]) for k in a.parts)
            and a.turns == b.turns)


def test_an_entry_is_read_back_as_written_and_not_sampled_again(tmp_path):
    first, make = SftMemo("k", root=tmp_path), Counter(gens())
    assert same(first(7, ["p", "q"], make), gens()) and make.calls == 1
    again, never = SftMemo("k", root=tmp_path), Counter(gens(scale=2.0))
    assert same(again(7, ["p", "q"], never), gens()) and never.calls == 0
    assert (again.reused, again.sampled) == (1, 0) and (first.reused, first.sampled) == (0, 1)
    assert again.describe().startswith("1 of 1 sampled by an earlier eval")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.parametrize(("key", "seed", "prompts"), [("other", 7, ["p", "q"]), ("k", 8, ["p", "q"]),
                                                      ("k", 7, ["p"]), ("k", 7, ["q", "p"])])
def test_another_key_seed_or_prompt_list_samples_again(tmp_path, key, seed, prompts):
    SftMemo("k", root=tmp_path)(7, ["p", "q"], Counter(gens()))
    make = Counter(gens(scale=2.0))
    assert same(SftMemo(key, root=tmp_path)(seed, prompts, make), gens(scale=2.0)) and make.calls == 1


def test_refresh_samples_again_and_replaces_the_entry(tmp_path):
    SftMemo("k", root=tmp_path)(7, ["p", "q"], Counter(gens()))
    make = Counter(gens(scale=2.0))
    assert same(SftMemo("k", refresh=True, root=tmp_path)(7, ["p", "q"], make), gens(scale=2.0)) and make.calls == 1
    assert same(SftMemo("k", root=tmp_path)(7, ["p", "q"], Counter(gens())), gens(scale=2.0))


def test_a_damaged_entry_is_sampled_again_with_a_warning(tmp_path, caplog):
    memo = SftMemo("k", root=tmp_path)
    memo.path(7, ["p", "q"]).parent.mkdir(parents=True, exist_ok=True)
    memo.path(7, ["p", "q"]).write_bytes(b"half a pickle")
    make = Counter(gens())
    with caplog.at_level(logging.WARNING, logger="stages.eval_memo"):
        assert same(memo(7, ["p", "q"], make), gens()) and make.calls == 1
    assert str(memo.path(7, ["p", "q"])) in caplog.text and "sampling again" in caplog.text
    assert same(SftMemo("k", root=tmp_path)(7, ["p", "q"], Counter(gens(scale=2.0))), gens())


def test_a_failed_sampling_leaves_no_entry(tmp_path):
    def boom() -> Generations:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        SftMemo("k", root=tmp_path)(7, ["p"], boom)
    assert not SftMemo("k", root=tmp_path).path(7, ["p"]).exists()


def result(stage: str, digest: str) -> StageResult:
    return StageResult(stage=stage, status="ran", cache_key="c", mlflow_run_id="r", artifact_uri="file:///a",
                       digest=digest)


def key(eval_keys: dict | None = None, ppo: str = "p1", reward: str = "r1", device: str = "cpu",
        frozen: str = "float32", temperature: float = 0.7) -> str:
    section = {"eval": {"temperature": temperature, "seed": 1, "best_of": [4], "samples_in_report": 16,
                        **(eval_keys or {})}, "model": {"dtype": "float32"}}
    upstream = {"sft": result("sft", "s1"), "reward": result("reward", reward), "ppo": result("ppo", ppo)}
    return memo_key(section, upstream, "data", device, frozen)


def test_the_key_follows_the_sft_side_not_the_policy_or_what_is_compared():
    base = key()
    assert key(ppo="p2") == base  # a sweep of PPO settings shares the SFT side
    assert key({"best_of": [4, 16], "best_of_prompts": 8, "samples_in_report": 2, "max_prompts": 9}) == base
    assert len({base, key(reward="r2"), key(device="cuda:0"), key(frozen="bfloat16"), key(temperature=1.0)}) == 5


@pytest.mark.parametrize("forge", [
    lambda g: {**g, "texts": g["texts"][:1]},  # a reply short
    lambda g: {**g, "scores": torch.tensor([0.5, float("inf")])},  # a score that is not finite
    lambda g: {**g, "scores": "0.5, -1.0"},  # a string for a tensor
    lambda g: {**g, "has_eos": torch.tensor([1.0, 0.0])},  # not a bool tensor
    lambda g: {**g, "gold": [0.25, "1.0"]},
    lambda g: {**g, "parts": {"rm": torch.tensor([0.5])}},
    lambda g: {**g, "terms": {"length": [1.0, float("nan")]}},
])
def test_a_forged_entry_that_loads_is_checked_field_by_field_and_sampled_again(tmp_path, caplog, forge):
    """An entry that `torch.load(weights_only=True)` reads but that `generate_and_score` could not have written for
    these prompts (wrong lengths, a string for a tensor, a score that is not finite) would fake the SFT baseline: it
    is sampled again with a warning naming the field."""
    import dataclasses

    memo = SftMemo("k", root=tmp_path)
    memo.path(7, ["p", "q"]).parent.mkdir(parents=True, exist_ok=True)
    torch.save(forge(dataclasses.asdict(gens())), memo.path(7, ["p", "q"]))
    make = Counter(gens(scale=2.0))
    with caplog.at_level(logging.WARNING, logger="stages.eval_memo"):
        assert same(memo(7, ["p", "q"], make), gens(scale=2.0)) and make.calls == 1
    assert "sampling again" in caplog.text
