"""Train an agent with GRPO: `accelerate launch train.py --config recipes/X.yaml`.

With no arguments it runs the offline CPU demo (recipes/cpu_demo.yaml).
"""

from agentic_grpo.train import main

if __name__ == "__main__":
    raise SystemExit(main())
