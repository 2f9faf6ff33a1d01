"""DPO and IPO (`rlhf_lib.dpo`): the losses and their gradients by hand, the masks of the sequence log-probs, the
pairs of a ranked list, the reference pass and a few steps of training on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lib.config import DPOConfig
from rlhf_lib.data.collate import sft_rows
from rlhf_lib.data.records import RankedExample
from rlhf_lib.dpo import (
    budget_logps,
    dpo_loss,
    encode_pairs,
    heldout_metrics,
    pair_logps,
    preference_pairs,
    response_tokens,
    rows_logps,
    sequence_logps,
    step_stats,
    train_dpo,
)
from rlhf_lib.events import Metrics, Recorder, metrics_log

# One pair: log π(y_c) = -5, log π(y_r) = -7, log π_ref(y_c) = log π_ref(y_r) = -6, β = 0.1.
# h = (-5 - -6) - (-7 - -6) = 1 - (-1) = 2, β·h = 0.2.
PC, PR, RC, RR, BETA = -5.0, -7.0, -6.0, -6.0, 0.1
SIG_02 = 1 / (1 + math.exp(-0.2))  # σ(0.2) = 0.549833997, σ(-0.2) = 0.450166003


def _loss(loss_type: str, label_smoothing: float = 0.0, tokens: tuple[float, float] = (1.0, 1.0)):
    pc, pr = torch.tensor([PC], requires_grad=True), torch.tensor([PR], requires_grad=True)
    losses, chosen, rejected = dpo_loss(pc, pr, torch.tensor([RC]), torch.tensor([RR]), BETA, loss_type,
                                        label_smoothing, torch.tensor([tokens[0]]), torch.tensor([tokens[1]]))
    losses.sum().backward()
    return float(losses.detach()), float(pc.grad), float(pr.grad), float(chosen), float(rejected)


def test_sigmoid_loss_and_gradient_by_hand():
    loss, g_c, g_r, chosen, rejected = _loss("sigmoid")
    # -log σ(0.2) = log(1 + e^-0.2) = log(1.818730753) = 0.598138869
    assert loss == pytest.approx(0.598138869, abs=1e-7)
    # d/dπ_c = -β·σ(-β·h) = -0.1 × 0.450166003 = -0.0450166003; d/dπ_r is its opposite
    assert g_c == pytest.approx(-0.0450166003, abs=1e-8) and g_r == pytest.approx(0.0450166003, abs=1e-8)
    # implicit rewards β·(π - ref): 0.1 × 1 = 0.1 and 0.1 × -1 = -0.1
    assert (chosen, rejected) == (pytest.approx(0.1), pytest.approx(-0.1))


def test_label_smoothing_by_hand():
    loss, g_c, g_r, _, _ = _loss("sigmoid", 0.25)
    # 0.75 × -log σ(0.2) + 0.25 × -log σ(-0.2) = 0.75 × 0.598138869 + 0.25 × 0.798138869
    #   = 0.448604152 + 0.199534717 = 0.648138869   (log(1 + e^0.2) = 0.598138869 + 0.2)
    assert loss == pytest.approx(0.648138869, abs=1e-7)
    # d/dπ_c = -β·[(1 - ε)·σ(-0.2) - ε·σ(0.2)] = -0.1 × (0.337624502 - 0.137458499) = -0.0200166003
    assert g_c == pytest.approx(-0.0200166003, abs=1e-8) and g_r == pytest.approx(0.0200166003, abs=1e-8)
    # the minimum sits at the finite β·h = log((1 - ε)/ε) = log 3: there σ(-log 3) = 1/4, σ(log 3) = 3/4 and the
    # gradient -β·(0.75 × 1/4 - 0.25 × 3/4) = 0
    pc = torch.tensor([RC + math.log(3) / BETA], requires_grad=True)
    dpo_loss(pc, torch.tensor([RR]), torch.tensor([RC]), torch.tensor([RR]), BETA, "sigmoid", 0.25)[0].sum().backward()
    assert float(pc.grad) == pytest.approx(0.0, abs=1e-7)


def test_ipo_loss_and_gradient_by_hand():
    # one token each: the mean is the sum. 1/(2β) = 5: (h - 5)² = (2 - 5)² = 9; d/dπ_c = 2·(h - 5) = -6, d/dπ_r = +6
    loss, g_c, g_r, _, _ = _loss("ipo")
    assert loss == pytest.approx(9.0) and g_c == pytest.approx(-6.0) and g_r == pytest.approx(6.0)
    # at h = 1/(2β) the loss and its gradient are 0: IPO stops at a finite margin
    pc = torch.tensor([RC + 5.0], requires_grad=True)
    one = torch.tensor([1.0])
    out = dpo_loss(pc, torch.tensor([RR]), torch.tensor([RC]), torch.tensor([RR]), BETA, "ipo", 0.0, one, one)[0]
    out.sum().backward()
    assert float(out.detach()) == 0.0 and float(pc.grad) == 0.0


def test_ipo_averages_the_log_ratios_over_the_response_tokens_as_trl():
    # chosen 2 response tokens, rejected 4: h̄ = (-5 - -6)/2 - (-7 - -6)/4 = 0.5 + 0.25 = 0.75 (the summed h is 2)
    loss, g_c, g_r, chosen, rejected = _loss("ipo", tokens=(2.0, 4.0))
    # (0.75 - 5)² = (-4.25)² = 18.0625
    assert loss == pytest.approx(18.0625)
    # d/dπ_c = 2·(h̄ - 5)/2 = -4.25; d/dπ_r = 2·(h̄ - 5)·(-1/4) = +2.125
    assert g_c == pytest.approx(-4.25) and g_r == pytest.approx(2.125)
    # the implicit rewards stay summed over the tokens: 0.1 × 1 and 0.1 × -1, as TRL logs them
    assert (chosen, rejected) == (pytest.approx(0.1), pytest.approx(-0.1))
    # the sigmoid loss ignores the counts: the same as with one token each
    assert _loss("sigmoid", tokens=(2.0, 4.0))[0] == pytest.approx(_loss("sigmoid")[0])
    with pytest.raises(ValueError, match="response tokens"):
        dpo_loss(torch.tensor([PC]), torch.tensor([PR]), torch.tensor([RC]), torch.tensor([RR]), BETA, "ipo")


def test_response_tokens_count_the_scored_tokens_eos_included(tiny_tokenizer):
    pairs = preference_pairs([RankedExample("Human: hi", ("Sure, topic 1 is nice.", "no"))])
    encoded = encode_pairs(tiny_tokenizer, pairs, max_length=64)
    chosen, rejected = response_tokens(encoded)
    # the labels sequence_logps scores (every one but the prompt's and padding) are as many as the counts
    for row, n in ((encoded[0][0], chosen), (encoded[0][1], rejected)):
        labels = sft_rows([row], tiny_tokenizer.pad_token_id)["labels"]
        assert int((labels[:, 1:] != -100).sum()) == int(n[0])
        assert row[0][-1] == tiny_tokenizer.eos_token_id  # the EOS is one of them
    assert int(rejected[0]) == len(tiny_tokenizer("no", add_special_tokens=False)["input_ids"]) + 1


def test_step_stats_carry_trls_names():
    losses, chosen, rejected = dpo_loss(torch.tensor([PC, -6.0]), torch.tensor([PR, -5.0]), torch.tensor([RC, -6.0]),
                                        torch.tensor([RR, -6.0]), BETA)
    # second pair: h = 0 - 1 = -1: rewards 0 and 0.1, a wrong order
    stats = step_stats(losses, chosen, rejected, torch.tensor([PC, -6.0]), torch.tensor([PR, -5.0]))
    assert set(stats) == {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                          "logps/chosen", "logps/rejected"}
    assert stats["rewards/accuracies"] == 0.5
    assert stats["rewards/margins"] == pytest.approx((0.2 + -0.1) / 2)
    assert stats["logps/chosen"] == pytest.approx(-5.5) and stats["logps/rejected"] == pytest.approx(-6.0)


def test_a_tie_of_the_rewards_is_not_an_accuracy_as_in_trl():
    # TRL 1.12: rewards/accuracies = (chosen_rewards > rejected_rewards).float().mean(); a pair with h = 0 counts 0
    tie = torch.tensor([-6.0])
    losses, chosen, rejected = dpo_loss(tie, tie, tie, tie, BETA)
    assert step_stats(losses, chosen, rejected, tie, tie)["rewards/accuracies"] == 0.0


def test_sequence_logps_counts_response_tokens_only():
    # V=3, T=4: prompt token at t=0, response tokens at t=1 (label 1) and t=2 (label 2), padding at t=3.
    # Position 0 predicts token 1 with logits [0, 0, 0] -> log 1/3; position 1 predicts token 2 with logits
    # [0, 0, log 2] -> log 2/4. Position 2 predicts the padding: not counted, nor the prompt (t=0 as a target).
    # Sum = log(1/3) + log(1/2) = -1.098612 - 0.693147 = -1.791759.
    logits = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, math.log(2)], [50.0, -50.0, 3.0], [7.0, 7.0, 7.0]]])
    labels = torch.tensor([[-100, 1, 2, -100]])
    assert float(sequence_logps(logits, labels)[0]) == pytest.approx(math.log(1 / 3) + math.log(1 / 2), abs=1e-6)
    # changing the logits that predict masked tokens changes nothing
    other = logits.clone()
    other[0, 2:] = torch.randn(2, 3) * 10
    assert torch.equal(sequence_logps(other, labels), sequence_logps(logits, labels))


def test_a_row_scores_the_same_alone_and_padded_beside_a_longer_one(tiny_tokenizer, tiny_policy):
    from rlhf_lib.data.records import PairExample

    short = PairExample("\n\nHuman: hi\n\nAssistant:", " Sure.", " No.")
    long = PairExample("\n\nHuman: topic 1 topic 1 topic 1\n\nAssistant:", " Sure, topic 1 is nice, very nice.",
                       " No.")
    enc = encode_pairs(tiny_tokenizer, [short, long], 64)
    tiny_policy.eval()
    with torch.no_grad():
        alone = rows_logps(tiny_policy, [enc[0][0]], tiny_tokenizer.pad_token_id, torch.device("cpu"))
        padded = rows_logps(tiny_policy, [enc[0][0], enc[1][0]], tiny_tokenizer.pad_token_id, torch.device("cpu"))
        # a longer prompt before the same response changes log π(response), the prompt's own tokens do not count
        prompt_only = sequence_logps(tiny_policy(torch.tensor([enc[0][0][0]])).logits,
                                     torch.tensor([[-100] * len(enc[0][0][0])]))
    assert float(padded[0]) == pytest.approx(float(alone[0]), abs=1e-5)
    assert float(prompt_only[0]) == 0.0
    chosen, rejected = pair_logps(tiny_policy, enc, tiny_tokenizer.pad_token_id, 1, torch.device("cpu"))
    assert float(chosen[0]) == pytest.approx(float(alone[0]), abs=1e-5) and chosen.shape == rejected.shape == (2,)


def test_a_token_budget_splits_the_forwards_and_keeps_each_rows_value_and_place(tiny_tokenizer, tiny_policy):
    """dpo.micro_batch_tokens: rows of 3 lengths under a budget that fits two short rows but not a long one beside
    them; the values come back in the rows' order, equal to one padded forward, and the gradient flows through all."""
    from rlhf_lib.data.records import PairExample

    pairs = [PairExample("\n\nHuman: topic 1 topic 1 topic 1 topic 1\n\nAssistant:", " Sure, topic 1 is nice.", " No."),
             PairExample("\n\nHuman: hi\n\nAssistant:", " Sure.", " Hm, no.")]
    enc = encode_pairs(tiny_tokenizer, pairs, 64)
    rows = [c for c, _ in enc] + [r for _, r in enc]
    lengths = [len(ids) for ids, _ in rows]
    assert len(set(lengths)) >= 3 and lengths.index(max(lengths)) == 0
    pad, cpu = tiny_tokenizer.pad_token_id, torch.device("cpu")
    tiny_policy.eval()
    whole = rows_logps(tiny_policy, rows, pad, cpu)
    calls = []
    hook = tiny_policy.register_forward_hook(lambda m, args, kw, out: calls.append(kw["input_ids"].shape),
                                             with_kwargs=True)
    try:
        split = budget_logps(tiny_policy, rows, pad, 2 * sorted(lengths)[-2], cpu)
    finally:
        hook.remove()
    assert len(calls) >= 2 and sum(c[0] for c in calls) == len(rows)  # several forwards, each row once
    assert sum(c[0] * c[1] for c in calls) < len(rows) * max(lengths)  # less padding than one forward
    assert torch.allclose(split, whole, atol=1e-5)
    split.sum().backward()
    assert all(p.grad is not None for p in tiny_policy.parameters() if p.requires_grad)
    assert torch.equal(budget_logps(tiny_policy, rows, pad, None, cpu).detach(), whole.detach())


def test_a_token_budget_trains_as_one_forward_and_keeps_old_keys():
    plain = DPOConfig()
    assert "micro_batch_tokens" not in plain.key() and "enabled" not in plain.key()
    assert DPOConfig(micro_batch_tokens=512).key()["micro_batch_tokens"] == 512
    with pytest.raises(ValueError):
        DPOConfig(micro_batch_tokens=0)


def test_every_pair_of_a_ranking_best_first():
    pairs = preference_pairs([RankedExample("p", ("a", "b", "c")), RankedExample("q", ("x", "y"))])
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("p", "a", "b"), ("p", "a", "c"), ("p", "b", "c"),
                                                                ("q", "x", "y")]


def test_heldout_accuracy_of_the_implicit_reward():
    # pair 0: margin 0.1·((-5+6) - (-7+6)) = 0.2 > 0, right; pair 1: margin 0 (a tie), wrong
    m = heldout_metrics((torch.tensor([-5.0, -3.0]), torch.tensor([-7.0, -3.0])),
                        (torch.tensor([-6.0, -3.0]), torch.tensor([-6.0, -3.0])), 0.1)
    assert m["dpo/heldout_accuracy"] == 0.5 and m["dpo/heldout_margin"] == pytest.approx(0.1)
    assert m["dpo/heldout_accuracy_ci95_low"] < 0.5 < m["dpo/heldout_accuracy_ci95_high"]


def test_label_smoothing_is_for_the_sigmoid_loss_only():
    with pytest.raises(ValueError, match="sigmoid only"):
        DPOConfig(loss_type="ipo", label_smoothing=0.1)


EXAMPLES = [RankedExample(f"\n\nHuman: topic {i}\n\nAssistant:", (f" Sure, topic {i} is nice.", " No.", " Hm."))
            for i in range(4)]


@pytest.mark.parametrize("options", [{}, {"loss_type": "ipo"}, {"lora": True, "lora_r": 2},
                                     {"micro_batch_tokens": 48}])
def test_training_starts_at_the_reference_and_moves_the_margin(tiny_tokenizer, tiny_policy, options):
    cfg = DPOConfig(batch_size=4, epochs=3, lr=5e-3, max_length=32, **options)
    rec = Recorder()
    final, model = train_dpo(tiny_policy, tiny_tokenizer, EXAMPLES, cfg, metrics_log(rec))
    steps = [e.values for e in rec.of(Metrics)]
    assert len(steps) == final["dpo/steps"] == 9 and final["dpo/pairs"] == 12  # 4 lists × 3 pairs, 3 per epoch
    # step 0 scores the reference itself: every implicit reward is 0, the loss log 2 (sigmoid) or (1/(2β))² (ipo)
    assert steps[0]["rewards/chosen"] == pytest.approx(0.0, abs=1e-5)
    assert steps[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    first = 25.0 if cfg.loss_type == "ipo" else math.log(2)
    assert steps[0]["loss"] == pytest.approx(first, abs=1e-4)
    assert steps[-1]["rewards/margins"] > 0.0 and steps[-1]["loss"] < first
    assert not hasattr(model, "peft_config")  # LoRA's adapters merged: a plain transformers model


def test_the_launched_entry_reads_its_job_as_the_launcher_writes_it(tiny_tokenizer, tiny_policy, tmp_path):
    """`launched` on a job built as `stages.supervised.train_supervised` builds it (JSON of the examples and config),
    in this one process: the examples and config come back typed, the trained model and final metrics are written."""
    import dataclasses
    import json

    from rlhf_lib.dpo import launched
    from rlhf_lib.model_dirs import save_model

    save_model(tiny_policy, tiny_tokenizer, tmp_path / "init")
    job = json.loads(json.dumps({"config": DPOConfig(batch_size=4, max_steps=2, max_length=32).model_dump(),
                                 "mixed_precision": "no", "device": "cpu", "gradient_checkpointing": False,
                                 "examples": [dataclasses.asdict(e) for e in EXAMPLES]}))
    rec = Recorder()
    launched(job, tmp_path, rec)
    assert len(rec.of(Metrics)) == 2
    assert json.loads((tmp_path / "final.json").read_text())["dpo/pairs"] == 12
    assert (tmp_path / "out" / "config.json").is_file()


def test_a_token_budget_follows_the_same_training_trajectory(tiny_tokenizer, tiny_policy):
    """The budget changes how the rows are grouped into forwards, not what the step computes: the same losses and
    margins step for step, up to float rounding."""
    import copy

    runs = []
    for budget in (None, 40):
        rec = Recorder()
        train_dpo(copy.deepcopy(tiny_policy), tiny_tokenizer, EXAMPLES,
                  DPOConfig(batch_size=4, epochs=2, lr=5e-3, max_length=32, micro_batch_tokens=budget),
                  metrics_log(rec))
        runs.append([(e.values["loss"], e.values["rewards/margins"]) for e in rec.of(Metrics)])
    assert len(runs[0]) == len(runs[1]) == 6
    for (loss_a, margin_a), (loss_b, margin_b) in zip(*runs):
        assert loss_b == pytest.approx(loss_a, abs=1e-4) and margin_b == pytest.approx(margin_a, abs=1e-4)
    assert runs[0][-1][1] > 0.0
