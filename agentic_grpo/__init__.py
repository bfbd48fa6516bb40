"""agentic-grpo: GRPO for LLM agents on multi-turn tool-use trajectories, on Hugging Face TRL."""

from agentic_grpo.environment import ToolEnvironment
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory

__all__ = [
    "AgenticGRPOConfig",
    "AgenticGRPOTrainer",
    "RolloutManager",
    "Segment",
    "ToolCall",
    "ToolEnvironment",
    "ToolResult",
    "Trajectory",
    "trainer_class",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The trainer pulls in TRL and torch; tools that only need the contracts stay light.
    if name == "AgenticGRPOConfig":
        from agentic_grpo.config import AgenticGRPOConfig

        return AgenticGRPOConfig
    if name == "AgenticGRPOTrainer":
        from agentic_grpo.trainer import AgenticGRPOTrainer

        return AgenticGRPOTrainer
    if name == "trainer_class":
        from agentic_grpo.trainer_layers import trainer_class

        return trainer_class
    if name == "RolloutManager":
        from agentic_grpo.rollout import RolloutManager

        return RolloutManager
    raise AttributeError(name)
