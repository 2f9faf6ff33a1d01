"""Every metric the pipeline logs, the run it goes to, what it means, and what a bad value looks like.

The reference (`docs/reference.md`, `rlhf reference`) is generated from this registry, and tests check that every
metric the loops log is in it. A `<name>` in a metric's name stands for a family (one metric per file, source or
reason).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricDoc:
    names: tuple[str, ...]
    meaning: str
    bad: str = "—"


def _m(names: str, meaning: str, bad: str = "—") -> MetricDoc:
    return MetricDoc(tuple(names.split()), meaning, bad)


PPO = (
    _m("objective/score_raw", "mean raw score of the rollout's responses: the weighted sum of the reward sources "
       "(`ppo.rewards`; by default the RM's score alone)",
       "rising while `objective/gold` falls or length runs away: reward hacking"),
    _m("objective/score/<name> objective/score/<name>_weighted", "each reward source's mean raw score, and times its "
       "weight (their sum is `objective/score_raw`)", "one source falling while the sum rises: the policy trades "
       "that source for the others (the reward_hacking alarm fires)"),
    _m("objective/score_raw_sem objective/gold_sem objective/score/<name>_sem", "standard error of each of those "
       "means over the rollout's responses (sample std / √batch): the noise the reward_hacking alarm's trends must "
       "clear (`ppo.alarm_z`)", "as large as the trends you watch: the batch is too small to tell them from noise"),
    _m("objective/rm_offset objective/rm_scale", "the RM normalisation: the mean (and with `ppo.rm_unit_std` the "
       "std, else 1) of `ppo.rm_offset_samples` SFT samples' raw scores, fixed before iteration 0",
       "a scale of ~1e-3 without rm_unit_std: the RM's signal is too small to weigh against the KL and EOS penalty"),
    _m("objective/score", "mean score that enters the reward: raw minus the RM offset (SFT samples average 0), divided "
       "by the RM scale, minus `ppo.missing_eos_penalty` where EOS is missing, then running-whitened and clipped when "
       "configured",
       "far below the raw score's trend: the EOS penalty is firing"),
    _m("objective/score_clipfrac", "share of scores `ppo.reward_clip` changed",
       "above ~0.2: the clip hides the reward signal (raise it)"),
    _m("objective/kl", "mean per-response KL to the reference, k1 estimator (sum over tokens of log π − log π_ref), "
       "nats", "many times `ppo.target_kl`: KL blow-up; clearly negative: log-prob mismatch between sampling and "
       "scoring"),
    _m("objective/kl_k2 objective/kl_k3", "the same KL with the k2 (½·r²) and k3 ((e^−r − 1) + r) estimators; k3 is "
       "never negative", "k1 far below k3: a few tokens with very negative log-ratios"),
    _m("objective/kl_coef", "β, the KL penalty weight used for this rollout (the adaptive controller's state)",
       "climbing without bound or collapsing to ~0 while KL stays off target"),
    _m("objective/non_score_reward", "mean per-response sum of −β·KL",
       "dominating `objective/score`: β too large, the policy cannot move"),
    _m("objective/reward_total", "mean per-response sum of the shaped reward (score + KL penalty)",
       "falling for many iterations"),
    _m("heldout/reward heldout/gold heldout/kl heldout/length", "evaluation during PPO (`ppo.eval_every`): RM score, "
       "gold score (demo task), KL to the reference (nats/response) and length of the policy's samples on "
       "`ppo.eval_prompts` held-out prompts, the same draws each time", "heldout/reward rising while heldout/gold "
       "falls: the policy over-optimises the RM on prompts it never trained on (`ppo.keep: best` keeps the best)"),
    _m("objective/gold", "the gold judge's mean score of the rollout's responses (demo task only; monitoring, never "
       "part of the reward)", "falling while `objective/score_raw` rises: over-optimisation of the RM"),
    _m("advantages/mean advantages/std advantages/min advantages/max", "advantages before whitening (GAE, or the "
       "group estimator of grpo/rloo), over real tokens", "std ~0: nothing to learn from; huge: reward scale problem"),
    _m("returns/mean returns/std returns/min returns/max value/mean", "value targets and the critic's predictions "
       "(GAE only)", "`value/mean` diverging from `returns/mean`: critic lag"),
    _m("value/explained_variance", "1 − Var(returns − values) / Var(returns) on the rollout",
       "≤ 0 after the first iterations: the critic is lagging"),
    _m("loss/policy loss/value loss/total", "the clipped surrogate, the clipped value loss, and their weighted sum "
       "(mean over the update's steps)", "`loss/value` growing: critic diverging; NaN: stop"),
    _m("loss/ptx", "PPO-ptx: SFT cross-entropy of the policy on demonstrations (`ppo.ptx_coef` > 0)",
       "rising steadily: the policy is losing what SFT taught it (raise `ppo.ptx_coef`)"),
    _m("policy/entropy", "mean per-token entropy of the policy on the rollout's tokens, at the sampling temperature (the "
       "first epoch's steps when `ppo.ent_coef` = 0, every step otherwise)",
       "dropping to ~0 in a few iterations: entropy collapse"),
    _m("policy/clipfrac", "share of tokens where the clipped surrogate is active",
       "above ~0.3: steps too large (lower `ppo.lr` or `ppo.epochs`)"),
    _m("policy/approx_kl", "½·E[(log π − log π_old)²] during the update",
       "above ~0.05: the update moves the policy too far per rollout"),
    _m("policy/ratio_mean", "mean π/π_old over the update", "far from 1: stale or mismatched log-probs"),
    _m("value/clipfrac", "share of tokens where the clipped value term is the larger",
       "near 1: `ppo.value_clip` too tight for the return scale"),
    _m("update/refused_steps", "update steps refused because the loss or gradient was NaN/inf (weights and Adam "
       "state untouched)", "any non-zero value; `ppo.max_refused_iterations` such iterations in a row fail the stage"),
    _m("grad_norm/total grad_norm/policy grad_norm/value", "gradient norms before the global clip: all parameters, "
       "the policy's, the critic's", "spikes, or far above `ppo.max_grad_norm` every step (lower `ppo.lr`); NaN"),
    _m("lr/policy lr/value", "learning rates of the iteration (after `ppo.lr_schedule`)", "not what you configured"),
    _m("update/epochs", "PPO epochs actually run (fewer than `ppo.epochs` when `ppo.early_stop_kl` fired)",
       "1 every iteration: the bound is too tight or the lr too high"),
    _m("update/critic_warmup", "1 during the `ppo.critic_warmup` value-only iterations"),
    _m("response/length_mean response/length_max", "response tokens including EOS (multi-turn: the policy's own "
       "tokens over all its turns)", "mean climbing toward `ppo.max_new_tokens`: length explosion"),
    _m("env/step_errors", "multi-turn rollouts: policy turns whose environment step raised (the episode read an "
       "error observation and went on; the rollout was not lost)", "above 0: the environment has a bug or meets "
       "replies it does not expect"),
    _m("env/turns_mean env/tokens_mean env/return_mean", "multi-turn rollouts (`ppo.environment`): policy turns per "
       "episode, the environment's tokens per episode, and the environment's summed reward",
       "turns stuck at 1 (the policy never calls the tool) or at `ppo.max_turns` (it never stops calling it)"),
    _m("response/no_eos_frac", "share of responses that hit `ppo.max_new_tokens` without EOS",
       "rising toward 1: the policy stopped stopping"),
    _m("time/rollout_s time/score_s time/gae_s time/update_s time/iteration_s time/tokens_per_s",
       "seconds per phase (each a Prefect task), their sum, and generated tokens per second",
       "a phase suddenly slower: contention or a leak"),
    _m("time/compile_s", "ppo.rollout_engine=compiled: seconds spent compiling the decode step so far (the first "
       "step of each batch size and cache length; inside time/rollout_s of the iteration that compiled)",
       "still growing after the first iterations: prompt widths or batch sizes keep changing shape"),
    _m("time/rollout_wait_s time/overlap_s", "async rollouts (`ppo.async_rollouts`): the seconds the trainer waited "
       "for its rollout, and the part of the rollout's sampling (time/rollout_s, in the sampler's thread) hidden "
       "behind the trainer's phases; time/iteration_s is then the wait, score, gae and update",
       "time/rollout_wait_s near time/rollout_s: nothing is overlapped (sampling is longer than the update)"),
    _m("async/is_weight_mean async/is_weight_max async/is_truncated_frac", "async rollouts: the importance weights "
       "pi_old / mu of the tokens (before truncation; mean and max over real tokens) and the share above "
       "`ppo.async_rollouts.is_cap`", "mean far from 1 or a growing truncated share: the sampler lags too far (the "
       "is_blowup alarm)"),
    _m("async/staleness", "async rollouts: updates between the weights that sampled the iteration's rollout and the "
       "trainer's (0 in a run's first iterations)", "not `ppo.async_rollouts.staleness` later: a resume sampled afresh"),
    _m("time/score/<name>_s", "seconds each reward source took in the score phase (this process's rows; the rest of "
       "`time/score_s` is the reference and value forwards)", "a judge or an endpoint many times the RM: its cost"),
    _m("ppo/truncated_prompts", "training prompts cut on the left to fit `model.n_positions - ppo.max_new_tokens` "
       "(once, step 0)", "most prompts: raise `model.n_positions`"),
)

SFT = (
    _m("sft/loss", "response-token cross-entropy of the step", "flat, or NaN"),
    _m("sft/loss_ema sft/grad_norm sft/lr sft/epoch", "its moving average, the gradient norm before clipping, the "
       "learning rate and the epoch"),
    _m("sft/final_loss_ema sft/steps", "the moving average at the end, and the optimizer steps taken (step 0)"),
    _m("sft/truncated_prompts sft/truncated_responses", "rows cut to fit `sft.max_length` (step 0)",
       "most rows cut: raise it or `model.n_positions`"),
)

REWARD = (
    _m("reward/loss", "Bradley-Terry loss of the step, averaged within each ranked list, then over lists",
       "flat at log 2 ≈ 0.69: nothing learned"),
    _m("reward/train_accuracy reward/train_accuracy_ema", "share of the batch's pairs in the right order, and its "
       "moving average", "stuck near 0.5"),
    _m("reward/margin reward/grad_norm reward/lr reward/epoch", "mean score gap of the pairs, gradient norm, learning "
       "rate, epoch"),
    _m("reward/steps", "optimizer steps taken (step 0)"),
    _m("reward/heldout_accuracy", "pairwise accuracy on the held-out pairs (noise-free judge pairs on the demo task, "
       "held-out human labels on user data)", "well below the labels' agreement with the judge: the RM underfits"),
    _m("reward/heldout_accuracy_ci95_low reward/heldout_accuracy_ci95_high", "Wilson 95 % interval of the held-out "
       "accuracy (the reward run's rm_report/ has it by margin, judge term and category)"),
    _m("reward/truncated_prompts reward/truncated_responses", "prompts and responses cut to fit `reward.max_length`",
       "many: the RM may not see what tells the responses apart"),
    _m("reward/baseline/<baseline>_accuracy", "with `reward.baselines`: the held-out accuracy of each cheap baseline "
       "on the same pairs (shorter, loglik: the policy's zero-shot log-likelihood, ngram: a bag-of-n-grams logistic "
       "regression, probe: a linear probe on the frozen base model; rlhf_lib/baselines.py)",
       "at or above reward/heldout_accuracy: the RM adds nothing a cheap rule has"),
    _m("reward/baseline/<baseline>_lead", "the RM's accuracy minus the baseline's on the same pairs (its paired 95 % "
       "interval is in rm_report/report.json)", "<= 0 for loglik: alarm rm_no_edge (ppo.require_rm_edge refuses PPO)"),
    _m("reward/adversarial_accuracy", "demo task: accuracy on the held-out split's adversarial minimal pairs (a "
       "clean response against its twin off-topic, looped, cut, padded with pleasantries or with too many facts; "
       "rlhf_lib/demo_task/adversarial.py)", "well under reward/heldout_accuracy: a blind spot PPO will find"),
    _m("reward/adversarial/<kind>_accuracy", "demo task: accuracy on the adversarial pairs of each kind (topic, loop, "
       "cut, politeness, facts)", "a kind near 0.5: the RM cannot see that flaw"),
    _m("reward/adversarial/worst_topic_pair_accuracy reward/adversarial/weak_topic_pairs", "demo task: the lowest "
       "accuracy over (prompt topic, other topic) swaps, and how many topic pairs score under 0.8 (the report lists "
       "the worst)", "a weak pair: PPO answers that prompt topic with the other topic"),
    _m("reward/adversarial/baseline/<baseline>_accuracy "
       "reward/adversarial/baseline/<baseline>_worst_topic_pair_accuracy",
       "demo task, with `reward.baselines`: prefer-shorter's and the n-gram regression's accuracy on the same "
       "adversarial pairs, and on their worst topic pair",
       "at or above the RM's: the cheap rule sees the flaw better"),
)

DATA = (
    _m("data/rows_<file>", "rows of each file the stages read (the five of the contract; the demo task adds "
       "prompts_val and adversarial_pairs)"),
    _m("data/sft_mean_gold data/ranked_best_mean_gold data/ranked_worst_mean_gold data/ranked_all_mean_gold "
       "data/eval_chosen_mean_gold data/eval_rejected_mean_gold", "the demo task's gold statistics"),
    _m("data/label_agreement", "share of ranked pairs in gold order (demo task): the ceiling of RM training accuracy"),
    _m("data/skipped_<source> data/skipped_<source>/<reason>", "bad rows skipped with `data.on_bad_row=skip`, in all "
       "and per reason", "more than a few percent: check the source's format and column mapping"),
    _m("data/dropped_heldout_<file>", "training rows dropped because their prompt is held out"),
)

EVAL = (
    _m("eval/reward_mean eval/reward_mean_sft", "summed score of the reward sources (the RM by default) of policy "
       "and SFT samples on the held-out prompts"),
    _m("eval/gold_reward_mean eval/gold_reward_mean_sft", "the gold judge's score of the same samples (demo task)"),
    _m("eval/win_rate_vs_sft", "share of held-out prompts where the judge prefers the policy's sample (a tie counts "
       "half); null without a judge", "below 0.5: PPO made things worse"),
    _m("eval/rm_win_rate_vs_sft", "the same judged by the reward model", "below 0.5: PPO did not even please its RM"),
    _m("eval/reward_lead_over_sft", "reward_mean minus reward_mean_sft, paired on the same prompts, with its "
       "interval: PPO's gain over its start (with a function reward such as exact match, a gain nobody can hack)",
       "an interval across 0: no measurable gain"),
    _m("eval/kl_to_ref", "mean per-response KL of the policy's samples to the SFT model (k1), nats",
       "far above `ppo.target_kl`: the policy drifted"),
    _m("eval/response_length_mean eval/response_length_mean_sft eval/no_eos_frac", "response length of policy and SFT, "
       "and the policy's share of responses without EOS"),
    _m("eval/reward_model_accuracy", "the RM's pairwise accuracy on the held-out pairs (absent without an RM)"),
    _m("eval/judge_<name>_accuracy", "each judge source's (`kind: judge`) pairwise accuracy on the same held-out "
       "pairs: its agreement with the labels, beside the RM's", "near 0.5: the judge cannot tell the replies apart"),
    _m("eval/reward_<name>_mean eval/reward_<name>_mean_sft", "each reward source's mean score for policy and SFT "
       "samples, when PPO used more than the RM alone (the arithmetic task's exact-match accuracy is one)",
       "the policy below SFT on a source: PPO traded it for the others"),
    _m("eval/truncated_prompts", "eval prompts cut on the left"),
    _m("eval/gold_<term>_mean eval/gold_<term>_mean_sft", "each term of the gold judge (topic, detail, tone, "
       "length, ending, repetition) for policy and SFT samples (demo task)", "the policy below SFT on a term, "
       "above all on topic: PPO traded it for what the RM rewards"),
    _m("eval/gold_<term>_delta", "policy minus SFT on each gold term, per prompt (paired), with its bootstrap "
       "interval: an interval across 0 is a tie", "an interval below 0: PPO lost on that term"),
    _m("eval/best_of_prompts", "with `eval.best_of`: the eval prompts (the first `eval.best_of_prompts`) that got "
       "best-of-n samples"),
    _m("eval/best_of_<n>_reward_mean eval/best_of_<n>_gold_mean eval/best_of_<n>_response_length_mean",
       "best-of-n from SFT (n samples, the one the reward sources score highest kept): its reward, gold score (demo "
       "task) and length on those prompts", "gold falling as n grows: the RM is being over-optimised already"),
    _m("eval/best_of_<n>_kl", "the KL of the best-of-n policy to SFT, log n - (n-1)/n nats: compare with "
       "eval/kl_to_ref"),
    _m("eval/gold_lead_over_best_of_<n> eval/reward_lead_over_best_of_<n> eval/win_rate_vs_best_of_<n> "
       "eval/rm_win_rate_vs_best_of_<n>",
       "PPO against best-of-n on the same prompts: its gold lead and its lead in the reward sources' sum (means of "
       "the per-prompt differences: with an exact-match reward, accuracy against an oracle best-of-n) and win rates "
       "by the gold judge and by the reward sources", "lead <= 0 at a KL above best-of-n's: PPO buys less with "
       "its KL than sampling and reranking"),
    _m("eval/<control>_reward_mean eval/<control>_gold_reward_mean eval/<control>_kl_to_ref "
       "eval/<control>_response_length_mean eval/<control>_no_eos_frac eval/<control>_win_rate_vs_sft "
       "eval/<control>_rm_win_rate_vs_sft",
       "each control arm of `eval.controls` (zero_reward, shuffled_reward: PPO with the reward replaced), and the "
       "DPO policy (dpo, with `dpo.enabled`), sampled on the eval prompts with PPO's seed: its reward, gold, KL to "
       "SFT, length, share without EOS and win rate over SFT (by the judge; rm_: by the reward sources)",
       "a control far above SFT: the shaping (EOS penalty, KL) alone moves the policy"),
    _m("eval/gold_lead_over_<control> eval/reward_lead_over_<control> eval/reward_<name>_lead_over_<control> "
       "eval/win_rate_vs_<control> eval/rm_win_rate_vs_<control>",
       "PPO against each control arm (and the DPO policy, dpo) on the same prompts: its paired lead in gold, in the "
       "reward sources' sum and in each source, and its win rates by the judge and by the reward sources, with "
       "intervals: what the reward taught beyond the shaping (over dpo: what the RM and sampling bought over DPO on "
       "the same pairs)", "an interval across or below 0: the reward did not teach what the figures against SFT "
       "suggest"),
    _m("eval/<arm>_gold_lead_over_<other> eval/<arm>_win_rate_vs_<other> eval/<arm>_reward_lead_over_<other> "
       "eval/<arm>_rm_win_rate_vs_<other>",
       "a policy besides PPO (dpo, then each control arm) against each later one and against each best-of-n "
       "(<other> = best_of_<n>, on the first eval.best_of_prompts prompts), paired on the same prompts: its lead in "
       "gold and in the reward sources' sum, and its win rates by the judge and by the reward sources, with "
       "intervals (e.g. dpo_win_rate_vs_zero_reward: what DPO learned beyond PPO's shaping; the other direction is "
       "1 - it). The report's win-rate matrix reads them", "DPO at or below the zero-reward control: the pairs "
       "taught DPO nothing the shaping does not"),
    _m("eval/gold_reward_mean_<group> eval/gold_reward_mean_sft_<group> eval/win_rate_vs_sft_<group>",
       "demo task: gold of policy and SFT and the gold win rate on prompts about topics training never saw "
       "(group new_topics) and about training topics asked in new ways (seen_topics)", "a gain on seen_topics "
       "only: the policy learned the training topics, not the skill"),
    _m("eval/by_<group>/<figure>", "with `eval.group_by` (a column of the eval prompts, e.g. calls): each group's "
       "reward_mean, reward_mean_sft, reward_lead_over_sft, <control>_reward_mean and reward_lead_over_<control> "
       "(gold figures too where there is a judge), named by_<column>_<value>, with intervals",
       "a lead only in the groups the demonstrations covered: the policy learned what SFT showed, not the skill"),
    _m("eval/constant_reply_gold_mean eval/gold_lead_over_constant_reply eval/win_rate_vs_constant_reply",
       "demo task: the best constant reply (one template with the topic filled in, picked by the RM on validation "
       "prompts; its text is in the report's lineage): its gold on the eval prompts, PPO's lead over it and PPO's "
       "gold win rate against it", "lead <= 0: a lookup table does as well as the trained policy"),
    _m("eval/<figure>_ci95_low eval/<figure>_ci95_high", "95 % interval of each held-out figure: a seeded bootstrap "
       "over prompts (means, win rates; the replies to a prompt asked more than once resampled together), "
       "Wilson's (shares: no_eos_frac, reward_model_accuracy)",
       "two runs whose intervals overlap cannot be told apart"),
)

DPO = (
    _m("loss", "DPO (or IPO: `dpo.loss_type`) loss of the step, the mean over its pairs",
       "sigmoid flat at log 2 ≈ 0.69: nothing learned; NaN"),
    _m("rewards/chosen rewards/rejected", "mean implicit reward β·(log π − log π_ref) of the chosen and the rejected "
       "replies (log-probs summed over the reply's tokens)", "rewards/chosen falling as fast as rewards/rejected: "
       "the policy lowers the likelihood of both (common; worrying when it runs away)"),
    _m("rewards/margins rewards/accuracies", "mean of chosen − rejected implicit reward, and the share of the batch's "
       "pairs where it is positive", "accuracies stuck near 0.5 (0 at step 0: every margin starts at 0)"),
    _m("logps/chosen logps/rejected", "mean log π of the chosen and rejected replies (nats, summed over tokens)",
       "both plunging: the policy leaves the data's distribution (lower the lr or raise β)"),
    _m("dpo/loss_ema dpo/grad_norm dpo/lr dpo/epoch", "the loss's moving average, gradient norm before clipping, "
       "learning rate, epoch"),
    _m("dpo/final_loss_ema dpo/steps dpo/pairs", "the moving average at the end, optimizer steps and training pairs "
       "(step 0)"),
    _m("dpo/truncated_prompts dpo/truncated_responses", "rows (two per pair) cut to fit `dpo.max_length` (step 0)",
       "most rows cut: raise it or `model.n_positions`"),
    _m("dpo/heldout_accuracy", "share of the held-out pairs (those of reward/heldout_accuracy) whose chosen reply "
       "gets the higher implicit reward β·(log π − log π_ref): DPO's reward model beside the trained one",
       "well under reward/heldout_accuracy or the baselines: DPO learned less from the pairs than the RM"),
    _m("dpo/heldout_accuracy_ci95_low dpo/heldout_accuracy_ci95_high", "Wilson 95 % interval of the held-out "
       "accuracy", "two runs whose intervals overlap cannot be told apart"),
    _m("dpo/heldout_margin", "mean held-out implicit-reward margin, chosen − rejected"),
)

# Logged on every stage's run (step 0) by the stage runner: what the build cost, for `rlhf plan` to be checked against.
SYSTEM = (
    _m("system/peak_rss_gb system/build_seconds", "the stage process's peak resident memory while the stage built "
       "(GiB, sampled; freed memory of earlier stages returned first) and the build's seconds",
       "far above `rlhf plan`'s estimate: a leak, or an estimate to fix"),
    _m("system/start_rss_gb", "the process's resident memory as the stage started, after freed memory was returned "
       "(GiB): what earlier stages of the same process left behind",
       "well above a fresh process's ~0.5 GiB: earlier stages' memory is carried into this one's peak"),
)

RUNS = {"ppo": PPO + SYSTEM, "sft": SFT + SYSTEM, "reward": REWARD + SYSTEM, "data": DATA + SYSTEM,
        "eval": EVAL + SYSTEM, "dpo": DPO + SYSTEM}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"<[a-z_]+>", "[^/]+", re.escape(name).replace(r"\<", "<").replace(r"\>", ">"))
                      + "$")


def documented(metric: str) -> bool:
    """Whether `metric` (as logged) is in the registry."""
    return any(_pattern(n).match(metric) for docs in RUNS.values() for d in docs for n in d.names)
