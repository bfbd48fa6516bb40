"""Sub-agents as tools: a call runs another policy's whole multi-turn rollout and returns its final answer.

- `SubAgent` (`agent.py`): the tool the parent sees, the nested batched rollout behind it, the child records.
- `PolicySource`, `ModelSource` (`sources.py`): the policy's model under a LoRA adapter, or a frozen model.
- `EndpointSource` (`endpoint.py`): any OpenAI-compatible server through the `openai` client.
- `adapters.py`: named adapters on the policy's one PeftModel, and generation under a chosen one.
- `spec.py`: the recipe's `subagents:` block.
- `usage.py`: calls and tokens of the sub-agents under a trajectory (delegation's cost).
"""

from agentic_grpo.subagents.agent import SubAgent
from agentic_grpo.subagents.endpoint import EndpointSource
from agentic_grpo.subagents.sources import ModelSource, PolicySource
from agentic_grpo.subagents.spec import SubAgentConfig, build_subagents
from agentic_grpo.subagents.usage import descendants, generated_tokens, subagent_usage

__all__ = [
    "EndpointSource",
    "ModelSource",
    "PolicySource",
    "SubAgent",
    "SubAgentConfig",
    "build_subagents",
    "descendants",
    "generated_tokens",
    "subagent_usage",
]
