from __future__ import annotations

import math

import pytest
import torch

from rlhf_lib.config import RewardConfig
from rlhf_lib.data.records import RankedExample
from rlhf_lib.reward import bradley_terry_loss, closest_pair_weights, pair_weights, ranked_pairs


def test_ranked_pairs_cover_every_pair_best_first():
    better, worse = ranked_pairs([3, 2])
    # list 0 (flat 0,1,2): (0,1) (0,2) (1,2); list 1 (flat 3,4): (3,4)
    assert better.tolist() == [0, 0, 1, 3]
    assert worse.tolist() == [1, 2, 2, 4]


def test_bradley_terry_hand_case():
    # One list of 3 scored [2, 1, 0] best first: margins 1, 2, 1.
    # loss = mean(-log s(1), -log s(2), -log s(1)) = (0.31326 + 0.12693 + 0.31326) / 3 = 0.25115
    scores = torch.tensor([2.0, 1.0, 0.0])
    better, worse = ranked_pairs([3])
    loss, stats = bradley_terry_loss(scores, better, worse, torch.zeros(3, dtype=torch.long))
    sp = lambda x: math.log1p(math.exp(-x))  # noqa: E731  -log sigmoid(x)
    assert math.isclose(float(loss), (2 * sp(1) + sp(2)) / 3, rel_tol=1e-6)
    assert stats["accuracy"] == 1.0


def test_each_list_weighs_the_same():
    # List A has 3 pairs all with margin 0 (loss log 2 each), list B one pair with margin 0 -> both mean log 2.
    # A per-pair mean would give the same here, so make B's pair different: margin 1 -> -log s(1) = 0.31326.
    # per-list mean: (log 2 + 0.31326) / 2 = 0.50320; a per-pair mean would be (3 log 2 + 0.31326)/4 = 0.59818.
    scores = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0])
    better, worse = ranked_pairs([3, 2])
    list_of_pair = torch.tensor([0, 0, 0, 1])
    loss, stats = bradley_terry_loss(scores, better, worse, list_of_pair)
    assert math.isclose(float(loss), (math.log(2) + math.log1p(math.exp(-1))) / 2, rel_tol=1e-6)
    assert stats["accuracy"] == 0.25


def test_rank_distance_weights():
    # One list of 3 scored [0, 0, 2] best first: margins 0, -2, -2 (losses log 2, sp(-2), sp(-2)) at rank
    # distances 1, 2, 1. Weighted: (1 log 2 + 2 sp(-2) + 1 sp(-2)) / 4 = (0.69315 + 3 x 2.12693) / 4 = 1.76848.
    scores = torch.tensor([0.0, 0.0, 2.0])
    better, worse = ranked_pairs([3])
    weights = pair_weights(better, worse, "rank_distance")
    assert weights.tolist() == [1.0, 2.0, 1.0]
    assert pair_weights(better, worse, "uniform") is None
    loss, _ = bradley_terry_loss(scores, better, worse, torch.zeros(3, dtype=torch.long), weights)
    sp = lambda x: math.log1p(math.exp(-x))  # noqa: E731  -log sigmoid(x)
    assert math.isclose(float(loss), (sp(0) + 3 * sp(-2)) / 4, rel_tol=1e-6)


def test_label_smoothing_hand_case():
    # One pair, margin 2, eps 0.1: 0.9 * -log s(2) + 0.1 * -log s(-2) = 0.9 x 0.12693 + 0.1 x 2.12693 = 0.32693.
    # Its minimum is at m = log(0.9 / 0.1) = 2.1972: the gradient there is 0 (plain BT would still push).
    better, worse = ranked_pairs([2])
    one = torch.zeros(1, dtype=torch.long)
    sp = lambda x: math.log1p(math.exp(-x))  # noqa: E731  -log sigmoid(x)
    loss, stats = bradley_terry_loss(torch.tensor([2.0, 0.0]), better, worse, one, label_smoothing=0.1)
    assert math.isclose(float(loss), 0.9 * sp(2) + 0.1 * sp(-2), rel_tol=1e-6) and stats["margin"] == 2.0
    at_min = torch.tensor([math.log(9.0), 0.0], requires_grad=True)
    bradley_terry_loss(at_min, better, worse, one, label_smoothing=0.1)[0].backward()
    assert torch.allclose(at_min.grad, torch.zeros(2), atol=1e-6)
    plain = torch.tensor([math.log(9.0), 0.0], requires_grad=True)
    bradley_terry_loss(plain, better, worse, one)[0].backward()
    assert float(plain.grad[0]) == pytest.approx(-0.1)  # -sigmoid(-log 9) = -1/10


def test_center_coef_hand_case():
    # Scores [3, 1] (better first): margin 2, sum 4. loss = sp(2) + 0.01 x 16 = 0.12693 + 0.16 = 0.28693; shifting
    # both scores by -2 (sum 0) leaves only sp(2): the penalty moves the level, not the order.
    better, worse = ranked_pairs([2])
    one = torch.zeros(1, dtype=torch.long)
    sp = lambda x: math.log1p(math.exp(-x))  # noqa: E731  -log sigmoid(x)
    loss, _ = bradley_terry_loss(torch.tensor([3.0, 1.0]), better, worse, one, center_coef=0.01)
    assert math.isclose(float(loss), sp(2) + 0.16, rel_tol=1e-6)
    centred, _ = bradley_terry_loss(torch.tensor([1.0, -1.0]), better, worse, one, center_coef=0.01)
    assert math.isclose(float(centred), sp(2), rel_tol=1e-6)


def test_closest_pair_weights_pick_the_fewest_edits_per_list():
    # List 0: pairs (0,1) (0,2) (1,2): "chess" -> "yoga" 5 edits (4 substitutions, 1 deletion), "chess" -> "chest"
    # 1, "yoga" -> "chest" 5 -> [0, 1, 0]. List 1: one pair -> [1]. List 2: every pair 1 edit, a tie -> the first.
    lists = [[" Happy to help! chess", " Happy to help! yoga", " Happy to help! chest"], [" a", " completely else"],
             ["a", "b", "c"]]
    assert closest_pair_weights(lists).tolist() == [0, 1, 0, 1, 1, 0, 0]


def test_curriculum_steps_train_on_the_closest_pair_only(tiny_tokenizer, tiny_policy):
    # Lists whose far pair has the opposite label of what a length cue would say: the curriculum's first step must
    # log the Bradley-Terry loss of the closest pair alone, the plain run the mean over all three pairs.
    import copy

    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.reward import _encode, train_reward_model, training_scores

    ranked = [RankedExample("\n\nHuman: hi\n\nAssistant:", (" Sure, topic 1.", " Sure, topic 2.", " No."))]
    rm = build_scalar_model(tiny_policy, seed=0)
    torch.nn.init.normal_(rm.score.weight)
    ids, mask = _encode(tiny_tokenizer, [(ranked[0].prompt, r) for r in ranked[0].responses], 64)
    with torch.no_grad():
        scores = training_scores(rm, ids, mask)
    better, worse = ranked_pairs([3])
    per_pair = -torch.nn.functional.logsigmoid(scores[better] - scores[worse])
    assert closest_pair_weights([ranked[0].responses]).tolist() == [1, 0, 0]
    for steps, expected in ((1, per_pair[0]), (0, per_pair.mean())):
        logged = {}
        train_reward_model(copy.deepcopy(rm), tiny_tokenizer, ranked,
                           RewardConfig(epochs=1, batch_size=1, curriculum_steps=steps),
                           lambda step, metrics: logged.setdefault(step, metrics))
        assert math.isclose(logged[0]["reward/loss"], float(expected), rel_tol=1e-5), steps


def test_training_scores_equal_sequence_scores_on_right_padded_rows(tiny_tokenizer, tiny_policy):
    # Training goes through the model's own forward (a DDP wrapper syncs only those calls); the head must read the
    # same last real token as `sequence_scores`, which scoring and evaluation use.
    from rlhf_lib.lm.scoring import sequence_scores
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.reward import _encode, training_scores

    rm = build_scalar_model(tiny_policy, seed=0)
    torch.nn.init.normal_(rm.score.weight)
    ids, mask = _encode(tiny_tokenizer, [("\n\nHuman: hi\n\nAssistant:", " Sure."),
                                         ("\n\nHuman: topic 1\n\nAssistant:", " Sure, topic 1 is nice. Thanks!")], 64)
    assert (mask == 0).any()  # the first row is padded
    torch.testing.assert_close(training_scores(rm, ids, mask), sequence_scores(rm, ids, mask))


def test_micro_batch_tokens_give_the_one_forward_scores_and_gradient(tiny_tokenizer, tiny_policy):
    # Rows of 9, 2 and 8 tokens in a budget of 16: forwards [2, 8] (2 x 8 = 16) and [9]; the scores come back in the
    # rows' order, and the Bradley-Terry gradient over pairs that cross the forwards is the one-forward gradient.
    import copy

    from rlhf_lib.data.collate import token_budget_split
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.reward import batch_scores

    assert token_budget_split([9, 2, 8], [9, 2, 8], 16) == [[1, 2], [0]]
    rm = build_scalar_model(tiny_policy, seed=0)
    torch.nn.init.normal_(rm.score.weight)
    rows = [list(range(5, 14)), [5, 6], list(range(20, 28))]
    better, worse = ranked_pairs([3])
    grads = []
    for budget in (None, 16):
        model = copy.deepcopy(rm)
        scores = batch_scores(model, rows, tiny_tokenizer.pad_token_id, budget, torch.device("cpu"))
        loss, _ = bradley_terry_loss(scores, better, worse, torch.zeros(3, dtype=torch.long))
        loss.backward()
        grads.append((scores.detach(), [p.grad.clone() for p in model.parameters()]))
    (s1, g1), (s2, g2) = grads
    torch.testing.assert_close(s2, s1, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_held_out_scores_are_batched_by_length_and_returned_in_input_order(tiny_tokenizer, tiny_policy):
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.reward import score_texts

    rm = build_scalar_model(tiny_policy, seed=1)
    torch.nn.init.normal_(rm.score.weight)
    prompts = ["\n\nHuman: tell me about topic 1\n\nAssistant:"] * 5
    responses = [" Sure, topic 1 is nice. Thanks! Thanks! Thanks!", " Sure.", " Sure, topic 1.", " Thanks!", " No"]
    together = score_texts(rm, tiny_tokenizer, prompts, responses, 64, batch_size=2)
    alone = torch.cat([score_texts(rm, tiny_tokenizer, [p], [r], 64, batch_size=1) for p, r in zip(prompts, responses)])
    assert torch.allclose(together, alone, atol=1e-5) and len(set(together.tolist())) == 5


@pytest.mark.parametrize("share", [True, False])
def test_pair_scores_equal_scoring_each_side_alone(tiny_tokenizer, tiny_policy, share):
    from rlhf_lib.data.records import PairExample
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.reward import pair_scores, score_texts

    rm = build_scalar_model(tiny_policy, seed=1)
    torch.nn.init.normal_(rm.score.weight)
    pairs = [PairExample(f"\n\nHuman: tell me about topic {i}\n\nAssistant:", " Sure, topic is nice." + " Thanks!" * i,
                         " No.") for i in range(5)]
    chosen, rejected = pair_scores(rm, tiny_tokenizer, pairs, 64, batch_size=4, share_prompts=share)
    prompts = [p.prompt for p in pairs]
    assert torch.allclose(chosen, score_texts(rm, tiny_tokenizer, prompts, [p.chosen for p in pairs], 64), atol=1e-5)
    assert torch.allclose(rejected, score_texts(rm, tiny_tokenizer, prompts, [p.rejected for p in pairs], 64),
                          atol=1e-5)
