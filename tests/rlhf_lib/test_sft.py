from __future__ import annotations

import math

import torch

from rlhf_lib.data.collate import encode_prompt_response, sft_batch
from rlhf_lib.sft import response_lm_loss


def test_loss_counts_response_tokens_only():
    # V=2, T=3. Labels: prompt token at t=0 masked, response tokens at t=1 (label 1) and t=2 (label 0).
    # Position 0 predicts label[1]=1 with logits [0, 0] -> -log 0.5; position 1 predicts label[2]=0 with
    # logits [log 3, 0] -> p=3/4 -> -log 0.75. Mean = (0.69315 + 0.28768) / 2 = 0.49041.
    logits = torch.tensor([[[0.0, 0.0], [math.log(3), 0.0], [9.0, -9.0]]])
    labels = torch.tensor([[-100, 1, 0]])
    loss, stats = response_lm_loss(logits, labels)
    assert math.isclose(float(loss), (math.log(2) - math.log(0.75)) / 2, rel_tol=1e-6)
    assert stats["tokens"] == 2


def test_sft_batch_masks_prompt_and_padding(tiny_tokenizer):
    b = sft_batch(tiny_tokenizer, ["\n\nHuman: hi\n\nAssistant:", "\n\nHuman: topic 1\n\nAssistant:"],
                  [" Sure.", " Sure, topic 1 is nice."], max_length=64)
    for i, prompt in enumerate(["\n\nHuman: hi\n\nAssistant:", "\n\nHuman: topic 1\n\nAssistant:"]):
        n_prompt = len(tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"])
        n_real = int(b["attention_mask"][i].sum())
        assert (b["labels"][i, :n_prompt] == -100).all()
        assert (b["labels"][i, n_prompt:n_real] != -100).all()
        assert (b["labels"][i, n_real:] == -100).all()
        assert int(b["input_ids"][i, n_real - 1]) == tiny_tokenizer.eos_token_id


def test_truncation_keeps_eos_and_cuts_prompt_from_left(tiny_tokenizer):
    prompt = "\n\nHuman: " + "topic 1 " * 30 + "\n\nAssistant:"
    ids, n_prompt = encode_prompt_response(tiny_tokenizer, prompt, " Sure, topic 1 is nice." * 5, max_length=40)
    assert len(ids) == 40
    assert ids[-1] == tiny_tokenizer.eos_token_id
    assert n_prompt >= 20  # the prompt keeps at least half of max_length
    full_prompt = tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[:n_prompt] == full_prompt[-n_prompt:]


def test_micro_batch_tokens_give_the_one_forward_loss_and_gradient(tiny_tokenizer, tiny_policy):
    # Three rows cut into forwards by a 40-token budget: the loss is still the mean over all response tokens (each
    # forward weighs its token count, not 1/3), and so is its gradient.
    import copy

    from rlhf_lib.sft import batch_loss

    pairs = [("\n\nHuman: hi\n\nAssistant:", " Sure."),
             ("\n\nHuman: topic 1\n\nAssistant:", " Sure, topic 1 is nice. Thanks! Thanks!"),
             ("\n\nHuman: topic 2\n\nAssistant:", " Topic 2 is nice.")]
    encoded = [encode_prompt_response(tiny_tokenizer, p, r, 64) for p, r in pairs]
    out = []
    for budget in (None, 40):
        model = copy.deepcopy(tiny_policy)
        loss, n_tokens, _ = batch_loss(model, encoded, tiny_tokenizer.pad_token_id, budget, torch.device("cpu"))
        loss.backward()
        out.append((float(loss), n_tokens, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (l1, n1, g1), (l2, n2, g2) = out
    assert n1 == n2 == sum(len(ids) - n_prompt for ids, n_prompt in encoded)
    assert math.isclose(l2, l1, rel_tol=1e-5)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_max_steps_ends_training_and_its_schedule_there(tiny_tokenizer, tiny_policy):
    from rlhf_lib.config import SFTConfig
    from rlhf_lib.data.records import SFTExample
    from rlhf_lib.sft import train_sft

    examples = [SFTExample("\n\nHuman: tell me about topic 1\n\nAssistant:", " Sure.")] * 10
    seen = []
    cfg = SFTConfig(epochs=3, batch_size=4, lr=1e-3, max_length=32, max_steps=4)  # 9 steps without the cap
    final, _ = train_sft(tiny_policy, tiny_tokenizer, examples, cfg, log=lambda step, m: seen.append((step, m)))
    assert final["sft/steps"] == 4 and [s for s, _ in seen] == [0, 1, 2, 3]
    assert seen[-1][1]["sft/lr"] == 0.0  # the linear decay reaches 0 at max_steps, not at epoch 3's end
