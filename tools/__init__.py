"""Built-in tool environments. Recipes name them by import path, e.g. `agentic_grpo.tools.calculator:Calculator`."""
