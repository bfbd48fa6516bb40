"""Built-in rewards. Recipes name them by import path, e.g. `rewards.rules:Correctness`."""
