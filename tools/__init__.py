"""Built-in tool environments. Recipes name them by import path, e.g. `tools.calculator:Calculator`."""
