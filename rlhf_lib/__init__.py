"""RLHF library: data, models and the PPO algorithm in pure torch."""
