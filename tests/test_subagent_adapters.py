"""LoRA-adapter sub-agents: named adapters on the policy's one PeftModel, generation under a chosen one.

Real tiny models and real PEFT adapters throughout; the formats of `tests.subagent_support` only decide
what a turn means (a call, an answer), so that a random model's real tokens drive the sub-agent calls.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from agentic_grpo.backends import TransformersBackend
from agentic_grpo.environment import ToolEnvironment
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from agentic_grpo.rollout_parts import RolloutParts
from agentic_grpo.subagents import ModelSource, PolicySource, SubAgent
from agentic_grpo.subagents.adapters import attach_adapter, generating_as
from agentic_grpo.subagents.sources import attach_adapters, sampling_config
from tests.subagent_support import CallingFormat, RecordingGenerate

TARGETS = ["q_proj", "v_proj", "o_proj", "up_proj"]
QUESTIONS = ["What is 12 * 34?", "Multiply 120 by 7.", "hi there", "Which tool?"]


def save_adapter(base_dir: str, out, seed: int) -> str:
    """A random (non-zero) LoRA adapter for the tiny model, saved the way PEFT saves one."""
    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False),
    )
    model.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return save_adapter(tiny_model_dir, root / "x", seed=1), save_adapter(tiny_model_dir, root / "y", seed=2)


def policy_with(tiny_model_dir: str, path: str, name: str = "x") -> PeftModel:
    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), path, adapter_name=name,
                                     is_trainable=True)  # fmt: skip


def delegating_rollout(model, tokenizer, child_source, seed: int):
    """Parents on `model` whose every turn asks sub-agent `helper` (answering in one turn) about what they wrote."""
    child_parts = RolloutParts(
        ToolEnvironment, {}, CallingFormat([], tool=None), RolloutLimits(max_turns=1, max_tokens_per_turn=12)
    )
    agent = SubAgent("helper", "Helps.", child_parts, child_source)
    attach_adapters(model, [agent])
    config, eos_ids = sampling_config(model, tokenizer, 1.0)
    backend = TransformersBackend(model, tokenizer, config, eos_ids)
    manager = RolloutManager(
        ToolEnvironment, CallingFormat([agent.tool_schema()], tool="helper"), tokenizer,
        RolloutLimits(max_turns=3, max_tokens_per_turn=12, max_completion_tokens=400), agents=[agent],
    )  # fmt: skip
    prompts = [[{"role": "user", "content": q}] for q in QUESTIONS]
    torch.manual_seed(seed)
    with torch.no_grad():
        trajectories, _ = manager.rollout(prompts, [{} for _ in QUESTIONS], backend)
    manager.close()
    return trajectories


def ids_of(trajectories):
    return [(t.completion_ids, [c.completion_ids for c in t.children]) for t in trajectories]


def test_adapter_subagent_shares_the_base_weights_and_generates_what_separate_models_would(
    tiny_model_dir, tokenizer, adapters
):
    x_path, y_path = adapters
    shared = policy_with(tiny_model_dir, x_path)
    base_weights = {n: p.data_ptr() for n, p in shared.named_parameters() if "lora_" not in n}
    spy = RecordingGenerate(shared)

    nested = delegating_rollout(shared, tokenizer, PolicySource("y", y_path, temperature=1.0), seed=0)

    # One copy of the base weights: adding adapter y added LoRA matrices only, and both roles ran on this model.
    assert {n: p.data_ptr() for n, p in shared.named_parameters() if "lora_" not in n} == base_weights
    assert sorted(shared.peft_config) == ["x", "y"]
    children = [c for t in nested for c in t.children]
    assert children and all(c.delegation.adapter == "y" and c.delegation.policy == "adapter:y" for c in children)
    assert set(spy.adapters) == {"x", "y"} and spy.adapters[:2] == ["x", "y"]  # parent turn, then its children
    assert shared.active_adapter == "x"

    # The same rollout on two separate models, one per adapter, gives the same tokens, parents and children.
    separate_child = ModelSource.of(policy_with(tiny_model_dir, y_path, "y"), tokenizer, temperature=1.0)
    separate = delegating_rollout(policy_with(tiny_model_dir, x_path), tokenizer, separate_child, seed=0)
    assert ids_of(nested) == ids_of(separate)
    assert sum(len(t.children) for t in nested) >= len(QUESTIONS)

    # The check can fail: children on the wrong adapter write other tokens.
    wrong = delegating_rollout(shared, tokenizer, PolicySource("x", temperature=1.0), seed=0)
    assert [ids for _, ids in ids_of(wrong)] != [ids for _, ids in ids_of(nested)]


def test_adapter_switch_puts_back_adapter_grads_and_mode_even_when_generation_fails(tiny_model_dir, adapters):
    x_path, y_path = adapters
    model = policy_with(tiny_model_dir, x_path)
    attach_adapter(model, "y", y_path)
    model.train()
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    assert any(grads[n] for n in grads if ".x." in n) and not any(grads[n] for n in grads if ".y." in n)

    with pytest.raises(RuntimeError, match="generation failed"), generating_as(model, "y"):
        assert model.active_adapter == "y" and not model.training
        raise RuntimeError("generation failed")
    assert model.active_adapter == "x" and model.training
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads

    with generating_as(model, "__base__"):  # the base model: every adapter off, for the call only
        assert not model.training
    assert model.active_adapter == "x" and model.training
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads


def test_a_subagent_call_inside_the_rollout_leaves_dropout_off_below_the_root(tiny_model_dir, adapters):
    """The trainer samples with the root in train mode and every module below it in eval (`dropout_off`); a
    sub-agent's generation must give back that state, not switch every module to train mode."""
    from agentic_grpo.backends import dropout_off

    x_path, y_path = adapters
    model = policy_with(tiny_model_dir, x_path)
    attach_adapter(model, "y", y_path)
    model.train()
    with dropout_off(model):
        with generating_as(model, "y"):
            pass
        with generating_as(model, "__base__"):
            pass
        assert model.training  # the root: TRL tells a training step from an evaluation by it
        assert not any(m.training for m in list(model.modules())[1:])  # dropout stays off for the policy's turns
    assert all(m.training for m in model.modules())


def test_new_adapter_starts_as_the_base_model_and_is_frozen(tiny_model_dir, tokenizer, adapters):
    model = policy_with(tiny_model_dir, adapters[0])
    attach_adapter(model, "fresh", None)
    assert all(not p.requires_grad for n, p in model.named_parameters() if ".fresh." in n)
    assert all(p.abs().sum() == 0 for n, p in model.named_parameters() if "lora_B.fresh" in n)
    ids = torch.tensor([tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                                       tokenize=True, return_dict=False)])  # fmt: skip
    model.eval()
    with torch.no_grad():
        with generating_as(model, "fresh"):
            fresh = model(input_ids=ids).logits
        with generating_as(model, "__base__"):
            base = model(input_ids=ids).logits
        policy = model(input_ids=ids).logits
    assert torch.equal(fresh, base) and not torch.equal(policy, base)


def test_adapter_subagent_on_a_policy_without_lora_is_refused_with_the_fix(tiny_model_dir):
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="use_peft: true"):
        attach_adapter(plain, "y", None)
    with pytest.raises(ValueError, match="not a PEFT model"), generating_as(plain, "y"):
        pass


def test_the_base_of_a_model_without_adapters_is_the_model_itself(tiny_model_dir):
    """Evaluating the untrained policy: a `__base__` sub-agent answers with the model as it is."""
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).train()
    with generating_as(plain, "__base__") as model:
        assert model is plain and not plain.training
    assert plain.training


def test_the_unmerged_lora_policy_is_loaded_for_eval_when_a_subagent_runs_on_its_base(tiny_model_dir, adapters,
                                                                                      tmp_path):  # fmt: skip
    import shutil

    from transformers import AutoTokenizer

    from agentic_grpo.evaluate import load_policy_for

    trained = shutil.copytree(adapters[0], tmp_path / "trained")  # a run's output: the adapter and the tokenizer
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(trained)

    base_agent = SubAgent("helper", "Answers.", RolloutParts(ToolEnvironment, {}, CallingFormat([], tool=None),
                          RolloutLimits()), PolicySource("__base__"))  # fmt: skip
    parts = RolloutParts(ToolEnvironment, {}, CallingFormat([base_agent.tool_schema()]), RolloutLimits(),
                         agents=[base_agent])  # fmt: skip
    model, _ = load_policy_for(str(trained), parts)
    assert isinstance(model, PeftModel)  # merged, the trained weights would answer for the base


def test_unknown_adapter_is_named_with_the_ones_the_policy_has(tiny_model_dir, adapters):
    model = policy_with(tiny_model_dir, adapters[0])
    with pytest.raises(ValueError, match=r"no LoRA adapter `z` \(it has: x\)"), generating_as(model, "z"):
        pass


def test_a_subagents_own_policy_subagent_runs_on_the_trained_policys_model(tiny_model_dir, tokenizer, adapters):
    """policy -> `outer` (a frozen model of its own) -> `inner` (adapter y): `inner` runs on the policy's model."""
    x_path, y_path = adapters
    policy = policy_with(tiny_model_dir, x_path)
    frozen = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    inner = SubAgent("inner", "Answers.", RolloutParts(ToolEnvironment, {}, CallingFormat([], tool=None),
                     RolloutLimits(max_turns=1, max_tokens_per_turn=12)), PolicySource("y", y_path, temperature=1.0))  # fmt: skip
    outer_parts = RolloutParts(ToolEnvironment, {}, CallingFormat([inner.tool_schema()], tool="inner"),
                               RolloutLimits(max_turns=1, max_tokens_per_turn=12), agents=[inner])  # fmt: skip
    outer = SubAgent("outer", "Delegates.", outer_parts, ModelSource.of(frozen, tokenizer, temperature=1.0))
    attach_adapters(policy, [outer, inner])
    on_policy, on_frozen = RecordingGenerate(policy), RecordingGenerate(frozen)
    config, eos_ids = sampling_config(policy, tokenizer, 1.0)
    manager = RolloutManager(ToolEnvironment, CallingFormat([outer.tool_schema()], tool="outer"), tokenizer,
                             RolloutLimits(max_turns=2, max_tokens_per_turn=12), agents=[outer])  # fmt: skip
    torch.manual_seed(0)
    trajectories, _ = manager.rollout([[{"role": "user", "content": q}] for q in QUESTIONS], [{} for _ in QUESTIONS],
                                      TransformersBackend(policy, tokenizer, config, eos_ids))  # fmt: skip
    manager.close()

    grandchildren = [g for t in trajectories for c in t.children for g in c.children]
    assert grandchildren and all(g.delegation.adapter == "y" and g.delegation.agent == "inner" for g in grandchildren)
    assert set(on_policy.adapters) == {"x", "y"} and set(on_frozen.adapters) == {None}
    # One batch of `inner` calls per batch of `outer` children that made any: batched at every depth.
    outer_batches = {c.delegation.parent_turn for t in trajectories for c in t.children if c.children}
    assert on_policy.adapters.count("y") == len(outer_batches)


def test_adapter_children_can_keep_their_sampling_logprobs(tiny_model_dir, tokenizer, adapters):
    x_path, y_path = adapters
    source = PolicySource("y", y_path, temperature=0.7, sampling_logprobs=True)
    trajectories = delegating_rollout(policy_with(tiny_model_dir, x_path), tokenizer, source, seed=0)
    children = [c for t in trajectories for c in t.children]
    assert children and all(t.completion_logprobs is not None for t in trajectories)  # recorded while sampling

    alone = policy_with(tiny_model_dir, y_path, "y").eval()  # the adapter on a model of its own
    for child in children:
        ids = child.prompt_ids + child.completion_ids
        with torch.no_grad():
            logits = alone(input_ids=torch.tensor([ids])).logits[0]
        expected = torch.log_softmax(logits / 0.7, dim=-1)[torch.arange(len(child.prompt_ids) - 1, len(ids) - 1),
                                                            torch.tensor(child.completion_ids)]  # fmt: skip
        assert child.completion_logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_an_adapter_path_without_a_saved_adapter_is_refused_naming_it(tiny_model_dir, adapters, tmp_path):
    """A router recipe names its specialists' adapters by the directories their own runs wrote: one not trained
    yet stops the run in one line that says so, not in PEFT's hub lookup of a repository id."""
    x_path, _ = adapters
    model = policy_with(tiny_model_dir, x_path)
    missing = tmp_path / "team" / "units"
    with pytest.raises(ValueError, match=r"sub-agent adapter `units`: .*team/units holds no saved adapter"):
        attach_adapter(model, "units", str(missing))
    assert "units" not in model.peft_config
    attach_adapter(model, "units", x_path)  # a directory a run saved loads
    assert "units" in model.peft_config


@pytest.mark.parametrize("cotrained", [False, True], ids=["frozen", "cotrained"])
def test_a_resume_restores_the_policys_own_adapter_beside_the_subagents(tiny_model_dir, tmp_path, cotrained):
    """A checkpoint holds the policy's adapter at its top level and each sub-agent's in a folder of its own;
    transformers 5.19 then loads only the folders', and without the layer's restore a resumed router would train
    on from a fresh adapter (the resume canary caught it on a team run)."""
    from tests.subagent_support import helper, make_trainer

    def adapter_params(model) -> dict:
        return {n: p for n, p in model.named_parameters() if ".lora_" in n}

    saved = make_trainer(tiny_model_dir, tmp_path / "saved", helper(train=cotrained))
    with torch.no_grad():  # both adapters away from their initial values
        for p in adapter_params(saved.model).values():
            p.normal_(0, 0.1)
    saved.save_model(str(tmp_path / "checkpoint"))  # the model files of the Trainer's checkpoint
    assert (tmp_path / "checkpoint" / "helper" / "adapter_model.safetensors").is_file()

    resumed = make_trainer(tiny_model_dir, tmp_path / "resumed", helper(train=cotrained))
    resumed._load_from_checkpoint(str(tmp_path / "checkpoint"))
    expected = adapter_params(saved.model)
    got = adapter_params(resumed.model)
    assert got.keys() == expected.keys() and any(".lora_B.default." in n for n in got)
    for name, p in got.items():
        assert torch.equal(p, expected[name]), name
        assert p.requires_grad == (".default." in name or cotrained), name
