"""Built-in rewards. Recipes name them by import path, e.g. `agentic_grpo.rewards.rules:Correctness`."""
