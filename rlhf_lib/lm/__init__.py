"""What every stage shares about a causal language model: scoring (log-probs, values, sequence scores), generation
(sampling with a KV cache at a temperature), masked statistics, entropy and KL estimators (pure torch).

SFT, the reward model, PPO and eval import from here; `rlhf_lib.ppo` holds PPO alone, so an edit to PPO's losses
changes the cache key of PPO and eval only (docs/architecture.md, "What a cache key covers").
"""
