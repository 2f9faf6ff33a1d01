from __future__ import annotations

import copy
import math

import pytest
import torch

from rlhf_lib.config import RewardConfig
from rlhf_lib.data.records import RankedExample
from rlhf_lib.prompt_sharing import prompt_groups, shared_prompt_scores, supports_prompt_sharing, take_rows
from rlhf_lib.reward import batch_scores, bradley_terry_loss, ranked_pairs, step_scores

CPU = torch.device("cpu")
PAD = 0


def _scalar(arch: str) -> torch.nn.Module:
    """A tiny `*ForSequenceClassification` of `arch` with a random (non-zero) head, pad token 0, in eval mode (no
    dropout; gradients still flow)."""
    from transformers import (AutoModelForSequenceClassification, GPT2Config, GPTNeoXConfig, LlamaConfig,
                              Qwen2Config)

    small = dict(vocab_size=64, num_labels=1, pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    cfg = {
        "gpt2": lambda: GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, **small),
        "gpt_neox": lambda: GPTNeoXConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                          intermediate_size=64, max_position_embeddings=64, **small),
        "llama": lambda: LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     hidden_size=32, intermediate_size=64, max_position_embeddings=64, **small),
        "qwen2": lambda: Qwen2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     hidden_size=32, intermediate_size=64, max_position_embeddings=64, **small),
    }[arch]()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(cfg)
    torch.nn.init.normal_(model.score.weight)
    return model.eval()


# Two lists of 3 over prompts of 4 and 2 tokens, and a row whose prompt was cut shorter (its own prompt group).
ROWS = [([5, 6, 7, 8, 11, 12, 13], 4), ([5, 6, 7, 8, 14], 4), ([5, 6, 7, 8, 15, 16, 17, 18, 19], 4),
        ([9, 10, 20, 21], 2), ([9, 10, 22, 23, 24, 25, 26], 2), ([10, 27], 1)]


def test_prompt_groups_hand_case():
    prompts, responses, prompt_of = prompt_groups([([1, 2, 7], 2), ([1, 2, 8, 9], 2), ([2, 5], 1)])
    assert prompts == [[1, 2], [2]]
    assert responses == [[7], [8, 9], [5]]
    assert prompt_of == [0, 0, 1]
    prompts, _, prompt_of = prompt_groups(ROWS)
    assert prompts == [[5, 6, 7, 8], [9, 10], [10]] and prompt_of == [0, 0, 0, 1, 1, 2]


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "qwen2"])
@pytest.mark.parametrize("budget", [None, 12])
def test_shared_prompts_give_the_whole_row_scores_and_gradient(arch, budget):
    # Budget 12: prompts [2: [10], [9, 10]] then [[5..8]]; responses of a chunk in forwards of <= 12 padded tokens.
    # The Bradley-Terry loss over both lists' pairs must have the gradient of whole rows run in one forward.
    model = _scalar(arch)
    assert supports_prompt_sharing(model)
    better, worse = ranked_pairs([3, 3])
    list_of_pair = torch.tensor([0, 0, 0, 1, 1, 1])
    results = []
    for share in (False, True):
        m = copy.deepcopy(model)
        if share:
            scores = shared_prompt_scores(m, *prompt_groups(ROWS), PAD, budget, CPU)
        else:
            scores = batch_scores(m, [ids for ids, _ in ROWS], PAD, None, CPU)
        loss, _ = bradley_terry_loss(scores, better, worse, list_of_pair)
        loss.backward()
        results.append((scores.detach(), [p.grad.clone() for p in m.parameters()]))
    (s_whole, g_whole), (s_shared, g_shared) = results
    torch.testing.assert_close(s_shared, s_whole, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_whole, g_shared):
        # Elementwise within 1e-4, or within 1e-3 of the tensor's largest entry: the KV-cached and whole-row paths
        # sum in different orders, and an AVX2 host (no AVX-512) gave a 4e-6 difference on a 0.02 entry. A missing
        # or doubled term would be off by the entry's size.
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-3 * float(a.abs().max()) + 1e-7)


def test_padding_after_a_long_prompt_stays_inside_the_position_table():
    # GPT-2 with 12 positions: rows of 8 + 1 and 2 + 10 tokens fit, but the first row's response padded to 10
    # tokens would reach position 17 after its prompt; padding sits at position 0 instead.
    from transformers import AutoModelForSequenceClassification, GPT2Config

    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=12, vocab_size=64, num_labels=1, pad_token_id=PAD,
                     bos_token_id=1, eos_token_id=2)
    model = AutoModelForSequenceClassification.from_config(cfg).eval()
    torch.nn.init.normal_(model.score.weight)
    rows = [(list(range(3, 12)), 8), (list(range(20, 32)), 2)]
    with torch.no_grad():
        shared = step_scores(model, rows, PAD, None, CPU, share_prompts=True)
        whole = batch_scores(model, [ids for ids, _ in rows], PAD, None, CPU)
    torch.testing.assert_close(shared, whole, rtol=1e-5, atol=1e-5)


def test_step_scores_run_whole_rows_when_a_prompt_is_empty():
    # An empty prompt cannot be cached: the batch runs whole, with the same scores.
    model = _scalar("gpt2")
    rows = [([5, 6, 11], 2), ([5, 6, 14, 15], 2), ([12, 13], 0)]
    with torch.no_grad():
        shared = step_scores(model, rows, PAD, None, CPU, share_prompts=True)
        whole = batch_scores(model, [ids for ids, _ in rows], PAD, None, CPU)
    torch.testing.assert_close(shared, whole)


def test_sliding_window_caches_are_not_shared():
    from transformers import AutoModelForSequenceClassification, MistralConfig

    cfg = MistralConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=16,
                        intermediate_size=32, vocab_size=64, num_labels=1, pad_token_id=PAD, sliding_window=8)
    assert not supports_prompt_sharing(AutoModelForSequenceClassification.from_config(cfg))


def test_training_with_and_without_shared_prompts_ends_at_the_same_weights(tiny_tokenizer, tiny_policy):
    # Four Adam steps on two lists per step: sharing changes float rounding only, so the weights agree closely;
    # gradient checkpointing (no KV cache) falls back to whole rows and trains too.
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.reward import train_reward_model

    prompt = "\n\nHuman: tell me about topic {}\n\nAssistant:"
    ranked = [RankedExample(prompt.format(i), (f" Sure, topic {i} is nice. Thanks!", f" Sure, topic {i}.", " No."))
              for i in range(4)]
    rm = build_scalar_model(tiny_policy, seed=0)
    weights = []
    for share, ckpt in ((False, False), (True, False), (True, True)):
        cfg = RewardConfig(epochs=2, batch_size=2, lr=1e-3, share_prompts=share, micro_batch_tokens=40)
        final, model = train_reward_model(copy.deepcopy(rm), tiny_tokenizer, ranked, cfg, gradient_checkpointing=ckpt)
        assert final["reward/steps"] == 4 and math.isfinite(final["reward/train_accuracy_ema"])
        weights.append([p.detach().clone() for p in model.parameters()])
    for whole, shared, ckpt in zip(*weights):
        torch.testing.assert_close(shared, whole, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ckpt, whole, rtol=1e-4, atol=1e-5)


def test_the_shared_gradient_is_the_same_on_every_run():
    # Cache rows copied by advanced indexing (keys[rows]) get their gradients summed in an order that varies between
    # runs on 2 CPU threads, and so does the trained RM; index_select's backward adds them in a fixed order. A
    # demo-sized step: 16 lists of 6 rows, 128 wide.
    from transformers import AutoModelForSequenceClassification, GPT2Config

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, n_positions=64, vocab_size=64, num_labels=1, pad_token_id=PAD,
                     bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(cfg).eval()
    torch.nn.init.normal_(model.score.weight)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (int(n),), generator=g).tolist() for n in torch.randint(10, 20, (16,), generator=g)]
    rows = [(p + torch.randint(3, 64, (int(n),), generator=g).tolist(), len(p))
            for p in prompts for n in torch.randint(5, 30, (6,), generator=g)]
    grads = []
    for _ in range(3):
        m = copy.deepcopy(model)
        step_scores(m, rows, PAD, 1024, CPU, share_prompts=True).square().sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert all(torch.equal(grads[0], other) for other in grads[1:])


def test_shared_prompts_train_under_bf16_autocast(tiny_tokenizer, tiny_policy):
    # The cached keys and values come out of the prompt forward in bf16 and meet the responses' own in bf16.
    from rlhf_lib.distributed import ProcessGroup
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.reward import train_reward_model

    ProcessGroup("no")
    ranked = [RankedExample("\n\nHuman: tell me about topic 1\n\nAssistant:", (" Sure, topic 1.", " No.", " Hm."))] * 2
    final, _ = train_reward_model(build_scalar_model(tiny_policy, seed=0), tiny_tokenizer, ranked,
                                  RewardConfig(epochs=1, batch_size=2, share_prompts=True), group=ProcessGroup("bf16"))
    assert final["reward/steps"] == 1 and math.isfinite(final["reward/train_accuracy_ema"])


def test_sharded_weights_run_whole_rows(tiny_tokenizer, tiny_policy, monkeypatch):
    # Under FSDP or ZeRO-3 every forward gathers the weights, so every process must run the same forwards, and the
    # prompt forward's weights could be freed before the gradient comes back through its cache: rows run whole.
    from rlhf_lib import reward
    from rlhf_lib.distributed import ProcessGroup
    from rlhf_lib.models import build_scalar_model

    class Sharded(ProcessGroup):
        shards_parameters = True

    def refuse(*args, **kwargs):
        raise AssertionError("prompts shared under sharded weights")

    monkeypatch.setattr(reward, "shared_prompt_scores", refuse)
    ranked = [RankedExample("\n\nHuman: tell me about topic 1\n\nAssistant:", (" Sure, topic 1.", " No."))] * 2
    final, _ = reward.train_reward_model(build_scalar_model(tiny_policy, seed=0), tiny_tokenizer, ranked,
                                         RewardConfig(epochs=1, batch_size=2), group=Sharded())
    assert final["reward/steps"] == 1
    with pytest.raises(AssertionError, match="sharded"):  # the same batch with a plain group does share
        reward.train_reward_model(build_scalar_model(tiny_policy, seed=0), tiny_tokenizer, ranked,
                                  RewardConfig(epochs=1, batch_size=2), group=ProcessGroup())


def test_take_rows_on_cpu_is_indexing():
    x = torch.arange(12.0).reshape(3, 4)
    rows = torch.tensor([2, 0, 2])
    torch.testing.assert_close(take_rows(x, rows), x[rows])
