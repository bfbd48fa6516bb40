"""Sub-agents and experiments are layers over the policy's trainer: importing the trainer (or preparing the demo's
recipe) loads neither package, the trainer refuses a recipe whose layers its class lacks, and `trainer_class`
composes the layers a recipe needs."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from tests.helpers import ROOT, environment, run_process

LAYER_PACKAGES = ("agentic_grpo.experimental", "agentic_grpo.subagents")

PROBE = """
import json, sys
{code}
loaded = sorted(m for m in sys.modules if m.startswith("agentic_grpo"))
print(json.dumps(loaded))
"""


def loaded_modules(code: str) -> list[str]:
    result = run_process(sys.executable, "-c", PROBE.format(code=code), env=environment(), cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def layer_modules(loaded: list[str]) -> list[str]:
    return [m for m in loaded if m.startswith(LAYER_PACKAGES)]


def test_importing_the_trainer_loads_no_experimental_and_no_subagent_module():
    loaded = loaded_modules("import agentic_grpo.trainer")
    assert "agentic_grpo.trainer" in loaded and "agentic_grpo.chunked_logps" in loaded, "the probe reads the import"
    assert layer_modules(loaded) == []


def test_the_demo_recipe_prepared_and_its_trainer_class_load_neither_layer():
    code = (
        "from agentic_grpo.train import prepare\n"
        "from agentic_grpo.trainer_layers import trainer_class\n"
        "from agentic_grpo.trainer import AgenticGRPOTrainer\n"
        "run = prepare(['--config', 'cpu_demo', '--output_dir', '/tmp/agentic-grpo-layers-probe', '--max_steps', '1'])\n"
        "assert trainer_class(run.config, run.rollout_parts) is AgenticGRPOTrainer"
    )
    assert layer_modules(loaded_modules(code)) == []


def test_a_recipe_with_subagents_loads_that_layer_only():
    """The probe itself can see a layer load: a recipe with a sub-agent brings in the sub-agent package."""
    code = (
        "from agentic_grpo.trainer_layers import trainer_class\n"
        "from types import SimpleNamespace\n"
        "cls = trainer_class(SimpleNamespace(experimental={}, subagents=[{'name': 'helper'}]))\n"
        "assert cls.__name__ == 'AgenticGRPOTrainerWithSubAgents', cls.__name__"
    )
    loaded = layer_modules(loaded_modules(code))
    assert "agentic_grpo.subagents.layer" in loaded
    assert not [m for m in loaded if m.startswith("agentic_grpo.experimental")]


def test_trainer_class_composes_each_layer_before_the_policys_trainer_once():
    from agentic_grpo.experimental.cotrain_layer import CoTrainingLayer
    from agentic_grpo.experimental.layer import ExperimentsLayer
    from agentic_grpo.subagents.layer import SubAgentsLayer
    from agentic_grpo.trainer import AgenticGRPOTrainer
    from agentic_grpo.trainer_layers import trainer_class

    plain = SimpleNamespace(experimental={}, subagents=[])
    both = SimpleNamespace(experimental={"spread_first_action": True}, subagents=[{"name": "helper"}])
    assert trainer_class(plain) is AgenticGRPOTrainer
    layered = trainer_class(both)
    assert layered.__mro__[:3] == (layered, SubAgentsLayer, ExperimentsLayer)
    assert issubclass(layered, AgenticGRPOTrainer) and trainer_class(both) is layered, "one class per set of layers"
    assert trainer_class(SimpleNamespace(experimental={"spread_first_action": True}, subagents=[])).__mro__[1] is (
        ExperimentsLayer
    )
    # Co-training comes first: a resume restores the policy's adapter (SubAgentsLayer) before it makes the
    # co-trained adapters trainable again.
    cotrained = trainer_class(SimpleNamespace(experimental={"cotrain_subagents": True}, subagents=[{"name": "x"}]))
    assert cotrained.__mro__[:4] == (cotrained, CoTrainingLayer, SubAgentsLayer, ExperimentsLayer)


@pytest.mark.parametrize("layer", ["subagents", "experimental"])
def test_the_policys_trainer_refuses_a_recipe_whose_layer_it_lacks(tiny_model_dir, tmp_path, layer):
    from datasets import Dataset

    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.trainer import AgenticGRPOTrainer
    from tests.helpers import TRAINER_DEFAULTS

    settings = {**TRAINER_DEFAULTS, "output_dir": str(tmp_path)}
    if layer == "subagents":
        settings.update(
            environment="agentic_grpo.environment:ToolEnvironment", format="tests.subagent_support:CallingFormat",
            format_kwargs={"tool": "helper"},
            subagents=[{"name": "helper", "description": "Answers a sub-task.", "adapter": "helper",
                        "format": "tests.subagent_support:CallingFormat", "format_kwargs": {"tool": None}}],
        )  # fmt: skip
    else:
        settings.update(experimental={"action_temperature": 2.0}, format_kwargs={"constrain_actions": True})
    args = AgenticGRPOConfig(**settings)
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "2 + 2?"}], "question": "2 + 2?"}] * 4)
    with pytest.raises(ValueError, match=rf"uses {layer}, which `AgenticGRPOTrainer` has no layer for.*trainer_class"):
        AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                           args=args, train_dataset=rows)  # fmt: skip
