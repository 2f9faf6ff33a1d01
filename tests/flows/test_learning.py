"""RLHF learns, end to end: on the micro preset plus the overrides in `LEARN`, the PPO policy scores higher than
the SFT model under the hidden gold judge on held-out prompts, on two seeds. Behaviour only: seeded, no wall-time
bound.

The micro preset itself cannot learn; it checks wiring. Its 1-layer, 32-wide model after 3 SFT steps never emits
EOS, its 12-token responses are always cut, and a reward model of that size orders only ~0.6 of held-out pairs: with
longer SFT, RM and PPO runs but micro's model, PPO hacks the proxy (measured: RM win rate 1.0, gold -1.06 vs -0.81
for SFT). The overrides give SFT enough steps to write whole answers that end, a 2-layer, 64-wide model, 4x the
ranked lists, and a KL penalty that keeps PPO near what the reward model knows. With 8 SFT epochs instead of 12, one
seed of three wrote responses that ran to the 32-token limit (SFT length 31.8, PPO's win rate 0.53).

The margins come from the measured spread on the demo's test split, which since issue 37 holds topics no training
file names (`rlhf run full --preset micro <LEARN> --seeds 0,1,2`, 2026-12-06): gold gain over SFT 0.43, 0.22, 0.76
(mean 0.47, sd 0.27); win rate 0.719, 0.656, 0.984 (mean 0.79, sd 0.17). On the old split (only new asks of trained
topics) they were 0.80 / 0.61 / 0.59 and 0.891 / 0.906 / 0.844, and each seed had to clear the mean minus three
standard deviations. Here that bound is below zero, so the test asks what a learning pipeline must show on every
seed: a gold gain above 0.1 and a win rate above 0.6 (seed 1, the weakest of the two tested, clears them by 0.12 and
0.056).
"""

from __future__ import annotations

from cli.main import load_config

LEARN = [
    "data.n_train_prompts=256",  # more demonstrations than micro's 48
    "data.ranked_per_prompt=4",  # 1024 ranked lists for the reward model
    "data.n_eval_prompts=32",  # a gold mean over 32 held-out responses, not 8
    "model.n_layer=2",
    "model.n_head=4",
    "model.n_embd=64",
    "sft.epochs=12",
    "sft.lr=0.003",  # enough SFT steps to write whole responses and EOS
    "reward.epochs=2",
    "reward.lr=0.002",
    "ppo.iterations=30",
    "ppo.batch_size=32",
    "ppo.minibatches=4",
    "ppo.lr=0.0005",
    "ppo.kl_coef=0.1",  # twice the default: a weak reward model is hacked quickly without it
    "ppo.missing_eos_penalty=1.0",  # a response cut at max_new_tokens scores 1 lower (the judge also dislikes it)
    "ppo.max_new_tokens=32",  # a good response (~28 tokens) fits and can end
    "ppo.sample_every=10",
    "eval.max_new_tokens=32",
    "eval.best_of=[4]",  # the default [4, 16] samples 16 replies of each eval prompt; the test reads no best-of
]


def test_ppo_beats_sft_under_the_gold_judge_on_two_seeds(home):
    from cli.seeds import run_seeds
    from flows.pipeline import rlhf

    result = run_seeds(load_config("micro", None, LEARN), [0, 1], lambda cfg: rlhf(config=cfg, pipeline="full"))
    for seed, summary in result["seeds"].items():
        ev = summary["eval"]
        assert ev["gold_reward_mean"] > ev["gold_reward_mean_sft"] + 0.1, (seed, ev)
        assert ev["win_rate_vs_sft"] > 0.6, (seed, ev)
