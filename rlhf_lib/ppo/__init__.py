"""PPO for RLHF: masked statistics, KL, rewards and advantages, losses and metrics (pure torch)."""
