"""Sub-agents as tools: a call runs another policy's whole multi-turn rollout and returns its final answer.

- `SubAgent` (`agent.py`): the tool the parent sees, the nested batched rollout behind it, the child records.
- `PolicySource`, `ModelSource` (`sources.py`): the policy's model under a LoRA adapter, or a frozen model.
- `EndpointSource` (`endpoint.py`): any OpenAI-compatible server through the `openai` client.
- `adapters.py`: named adapters on the policy's one PeftModel, and generation under a chosen one.
- `spec.py`: the recipe's `subagents:` block.
- `usage.py`: calls and tokens of the sub-agents under a trajectory (delegation's cost).
"""

import importlib
from typing import Any

# Each name's module, imported on first use: a recipe without sub-agents never loads them.
_EXPORTS = {
    "SubAgent": "agent", "EndpointSource": "endpoint", "ModelSource": "sources", "PolicySource": "sources",
    "SubAgentConfig": "spec", "build_subagents": "spec", "descendants": "usage", "generated_tokens": "usage",
    "subagent_usage": "usage",
}  # fmt: skip
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
