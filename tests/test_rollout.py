"""The turn loop, played with scripted model text through the real tokenizer, tools and truncation."""

from __future__ import annotations

import json
import os
import threading

import pytest

from agentic_grpo.formats import load_format
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from tests.envs import BARRIER, MisbehavingTools
from tests.scripted import ScriptedBackend, case_prompt

CALL = 'Thought: multiply.\nAction: calculator\nAction Input: {"expression": "12 * 34"}\nObservation:'


def run(tokenizer, scripts, cases, **limits):
    fmt = load_format("react", MisbehavingTools.tool_schemas())
    manager = RolloutManager(MisbehavingTools, fmt, tokenizer, RolloutLimits(**limits))
    backend = ScriptedBackend(tokenizer, scripts)
    try:
        trajectories, stats = manager.rollout([case_prompt(c) for c in cases], [{"case": c} for c in cases], backend)
    finally:
        manager.close()
    return trajectories, stats, backend


def test_tool_call_then_final_answer(tokenizer):
    [t], stats, _ = run(tokenizer, {"ok": [CALL, " I know.\nFinal Answer: 408<|im_end|>"]}, ["ok"])
    assert t.finish_reason == "final_answer" and t.final_answer == "408"
    assert [s.role for s in t.segments] == ["prompt", "model", "tool", "model"]
    call, result = t.tool_calls[0]
    assert call.name == "calculator" and call.arguments == {"expression": "12 * 34"}
    assert result.output == "408" and result.ok
    assert t.segments[2].text == " 408\n"
    assert t.turns == 2 and stats.turns == 2


def test_loss_mask_marks_exactly_the_tool_segment(tokenizer):
    [t], _, _ = run(tokenizer, {"ok": [CALL, "Final Answer: 408<|im_end|>"]}, ["ok"])
    model1, tool, model2 = t.segments[1:]
    assert t.loss_mask == [1] * len(model1.token_ids) + [0] * len(tool.token_ids) + [1] * len(model2.token_ids)
    assert t.completion_ids == model1.token_ids + tool.token_ids + model2.token_ids


def test_all_live_trajectories_generate_in_one_call_per_turn(tokenizer):
    scripts = {"one": [CALL, "Final Answer: 408<|im_end|>"], "three": [CALL, CALL, CALL, "Final Answer: 1<|im_end|>"]}
    trajectories, _, backend = run(tokenizer, scripts, ["one", "one", "three", "three"], max_turns=6)
    assert backend.batches == [4, 4, 2, 2]
    assert [t.turns for t in trajectories] == [2, 2, 4, 4]


def test_unknown_tool_bad_arguments_and_exceptions_become_observations(tokenizer):
    scripts = {
        "unknown": ['Action: teleport\nAction Input: {"to": "moon"}\nObservation:', "Final Answer: 1<|im_end|>"],
        "badargs": ['Action: calculator\nAction Input: {"expr": "1+1"}\nObservation:', "Final Answer: 2<|im_end|>"],
        "raises": ['Action: explode\nAction Input: {"message": "kaboom"}\nObservation:', "Final Answer: 3<|im_end|>"],
        "calcerr": [
            'Action: calculator\nAction Input: {"expression": "__import__(1)"}\nObservation:',
            "Final Answer: 4<|im_end|>",
        ],
    }
    trajectories, _, _ = run(tokenizer, scripts, list(scripts))
    outputs = {}
    for name, t in zip(scripts, trajectories, strict=False):
        [(call, result)] = t.tool_calls
        assert result.error and not result.ok
        assert t.finish_reason == "final_answer"
        outputs[name] = result.output
    assert "unknown tool `teleport`" in outputs["unknown"] and "calculator" in outputs["unknown"]
    assert "missing expression" in outputs["badargs"]
    assert "RuntimeError: kaboom" in outputs["raises"]
    assert "unsupported element `Call`" in outputs["calcerr"]


def test_malformed_turn_is_answered_with_the_format_and_counted(tokenizer):
    scripts = {"bad": ["I think it is 408.\nObservation:", "Final Answer: 408<|im_end|>"]}
    [t], _, _ = run(tokenizer, scripts, ["bad"])
    assert t.malformed_turns == 1 and t.invalid and t.final_answer == "408"
    assert "Final Answer:" in t.segments[2].text and t.segments[2].role == "tool"


def test_tool_timeout_is_an_observation(tokenizer):
    slow = 'Action: sleep\nAction Input: {"seconds": 3}\nObservation:'
    [t], _, _ = run(tokenizer, {"slow": [slow, "Final Answer: 0<|im_end|>"]}, ["slow"], tool_timeout=0.3)
    [(_, result)] = t.tool_calls
    assert result.timed_out and "timed out after 0.3 s" in result.output
    assert t.finish_reason == "final_answer"


def test_tool_calls_of_one_turn_run_concurrently(tokenizer):
    # Four calls wait at a barrier of four: run one after another, the first would time out.
    BARRIER["barrier"] = threading.Barrier(4)
    meet = 'Action: meet\nAction Input: {"name": "x"}\nObservation:'
    trajectories, _, _ = run(tokenizer, {"meet": [meet, "Final Answer: met<|im_end|>"]}, ["meet"] * 4, tool_timeout=10)
    assert [t.tool_calls[0][1].output for t in trajectories] == ["x met everyone"] * 4


def test_long_tool_output_is_cut_to_the_token_budget_keeping_head_and_tail(tokenizer):
    shout = 'Action: shout\nAction Input: {"words": 400}\nObservation:'
    [t], _, _ = run(tokenizer, {"long": [shout, "Final Answer: done<|im_end|>"]}, ["long"], max_tool_output_tokens=120)
    [(_, result)] = t.tool_calls
    assert result.truncated
    assert result.output.startswith("word0") and result.output.endswith("END") and "middle cut" in result.output
    tool = t.segments[2]
    assert len(tool.token_ids) <= 120 + 4  # budget for the output plus the segment's own spacing
    assert tokenizer.eos_token_id not in tool.token_ids  # "<|im_end|>" in tool output stays plain text


def test_token_budget_ends_the_trajectory(tokenizer):
    [t], _, _ = run(tokenizer, {"loop": [CALL] * 10}, ["loop"], max_turns=10, max_completion_tokens=60)
    assert t.finish_reason == "length"
    assert len(t.completion_ids) <= 60


def test_max_turns_ends_the_trajectory(tokenizer):
    [t], _, _ = run(tokenizer, {"loop": [CALL] * 10}, ["loop"], max_turns=3, max_completion_tokens=4096)
    assert t.finish_reason == "max_turns" and t.turns == 3 and len(t.tool_calls) == 3


def test_observation_after_eos_opens_a_new_chat_turn(tokenizer):
    eos_call = 'Action: calculator\nAction Input: {"expression": "2 * 3"}<|im_end|>'
    [t], _, _ = run(tokenizer, {"eos": [eos_call, "Final Answer: 6<|im_end|>"]}, ["eos"])
    tool = t.segments[2]
    assert tool.text == "\n<|im_start|>user\nObservation: 6<|im_end|>\n<|im_start|>assistant\n"
    opener = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert tool.token_ids[-len(opener) :] == opener and opener[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


@pytest.mark.parametrize("bad", ["", "Thought: hmm", "Action:\nAction Input: {}"])
def test_unparsable_turns_never_crash_the_loop(tokenizer, bad):
    [t], _, _ = run(tokenizer, {"bad": [bad + "<|im_end|>"] * 3}, ["bad"], max_turns=3)
    assert t.finish_reason == "max_turns" and t.malformed_turns == 3


def test_code_runs_in_one_sandbox_slot_per_trajectory_and_workspaces_are_removed(tokenizer):
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool
    from agentic_grpo.tools.python import PythonInterpreter

    code = "import os; open('mine.txt','w').write('x'); print(os.getcwd(), sorted(os.listdir('.')))"
    call = "Action: python\nAction Input: " + json.dumps({"code": code}) + "\nObservation:"
    pool = SandboxPool(SandboxConfig(timeout_s=10))
    fmt = load_format("react", PythonInterpreter.tool_schemas())
    manager = RolloutManager(PythonInterpreter, fmt, tokenizer, RolloutLimits(tool_timeout=10), sandbox_pool=pool)
    backend = ScriptedBackend(tokenizer, {"py": [call, "Final Answer: done<|im_end|>"]})
    try:
        trajectories, _ = manager.rollout([case_prompt("py")] * 3, [{}] * 3, backend)
    finally:
        manager.close()
        pool.close()
    outputs = [t.tool_calls[0][1].output for t in trajectories]
    workspaces = [out.split(" [")[0] for out in outputs]
    assert len(set(workspaces)) == 3, outputs  # a slot, and a workspace, of its own per trajectory
    assert all(out.endswith("['mine.txt']") for out in outputs)  # nobody sees a sibling's file
    assert not any(os.path.exists(w) for w in workspaces)  # removed when the trajectory ended


def test_native_tool_calls_get_tool_responses_in_a_user_turn(tokenizer):
    fmt = load_format("tool_call", MisbehavingTools.tool_schemas(), answer_pattern=r"Answer:\s*(.+)")
    manager = RolloutManager(MisbehavingTools, fmt, tokenizer, RolloutLimits())
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call><|im_end|>'
    backend = ScriptedBackend(tokenizer, {"native": [call, "Answer: 408<|im_end|>"]}, turn_marker="<tool_response>")
    try:
        [t], _ = manager.rollout([case_prompt("native")], [{}], backend)
    finally:
        manager.close()
    assert t.final_answer == "408" and t.tool_calls[0][1].output == "408"
    assert t.segments[2].text == (
        "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_eos_other_than_the_tokenizers_closes_the_turn_once(tokenizer):
    """A model whose EOS list holds the template's end-of-turn token while `tokenizer.eos_token` is another one
    (Qwen-style: eos_token <|endoftext|>, turns end with <|im_end|>) gets one end-of-turn, not two."""
    import copy

    other = copy.deepcopy(tokenizer)
    other.eos_token = "<|endoftext|>"
    eos_ids = [other.convert_tokens_to_ids("<|im_end|>"), other.eos_token_id]
    fmt = load_format("react", MisbehavingTools.tool_schemas())
    manager = RolloutManager(MisbehavingTools, fmt, other, RolloutLimits())
    eos_call = 'Action: calculator\nAction Input: {"expression": "2 * 3"}<|im_end|>'
    backend = ScriptedBackend(other, {"eos": [eos_call, "Final Answer: 6<|im_end|>"]}, eos_ids=eos_ids)
    try:
        [t], _ = manager.rollout([case_prompt("eos")], [{"case": "eos"}], backend)
    finally:
        manager.close()
    model, tool = t.segments[1], t.segments[2]
    assert model.text.endswith("<|im_end|>")
    assert tool.text == "\n<|im_start|>user\nObservation: 6<|im_end|>\n<|im_start|>assistant\n"


def test_a_timed_out_python_tool_returns_what_it_printed(tokenizer):
    """The sandbox owns the deadline: its partial output reaches the model, not the outer guard's bare timeout."""
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool
    from agentic_grpo.tools.python import PythonInterpreter

    code = "import time; print('started', flush=True); time.sleep(30)"
    call = f"Action: python\nAction Input: {json.dumps({'code': code})}\nObservation:"
    pool = SandboxPool(SandboxConfig(timeout_s=1.0))
    fmt = load_format("react", PythonInterpreter.tool_schemas())
    manager = RolloutManager(PythonInterpreter, fmt, tokenizer, RolloutLimits(tool_timeout=1.0), sandbox_pool=pool)
    try:
        [t], _ = manager.rollout([case_prompt("slow")], [{}], ScriptedBackend(tokenizer, {"slow": [call]}))
    finally:
        manager.close()
        pool.close()
    _, result = t.tool_calls[0]
    assert result.timed_out and result.output.startswith("started") and "timed out after" in result.output


@pytest.mark.integration  # a sandboxed call of about 6 s
def test_the_sandbox_alone_owns_the_deadline_of_code_tools(tokenizer):
    """A rollout budget shorter than the slot's deadline does not cut the code off early (one owner, one timer):
    before, the guard (tool_timeout + 5 s grace) gave up on this call at 5.1 s and dropped its output."""
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool
    from agentic_grpo.tools.python import PythonInterpreter

    code = "import time; print('started', flush=True); time.sleep(5.5); print('finished')"
    call = f"Action: python\nAction Input: {json.dumps({'code': code})}\nObservation:"
    pool = SandboxPool(SandboxConfig(timeout_s=30.0))
    fmt = load_format("react", PythonInterpreter.tool_schemas())
    manager = RolloutManager(PythonInterpreter, fmt, tokenizer, RolloutLimits(tool_timeout=0.1), sandbox_pool=pool)
    try:
        [t], _ = manager.rollout([case_prompt("slow")], [{}], ScriptedBackend(tokenizer, {"slow": [call]}))
    finally:
        manager.close()
        pool.close()
    _, result = t.tool_calls[0]
    assert not result.timed_out and result.output == "started\nfinished"


@pytest.mark.integration  # a sandboxed call of about 6 s
def test_a_slot_is_not_released_while_a_call_is_still_inside_it(tokenizer):
    """A pure-Python tool that outlives its guard in a sandboxed environment keeps its slot until it returns."""
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool
    from tests.envs import SlowSandboxedTools

    pool = SandboxPool(SandboxConfig(timeout_s=0.2))
    fmt = load_format("react", SlowSandboxedTools.tool_schemas())
    manager = RolloutManager(SlowSandboxedTools, fmt, tokenizer, RolloutLimits(tool_timeout=0.2), sandbox_pool=pool)
    call = 'Action: linger\nAction Input: {"seconds": 6}\nObservation:'
    SlowSandboxedTools.events.clear()
    try:
        [t], _ = manager.rollout([case_prompt("linger")], [{}], ScriptedBackend(tokenizer, {"linger": [call]}))
    finally:
        manager.close()
    _, result = t.tool_calls[0]
    assert result.timed_out  # the guard (0.2 s + grace) gave up on the call ...
    assert SlowSandboxedTools.events == ["entered", "left"]  # ... but the slot went back only after it left
    assert pool.live_slots == 0
    pool.close()


def test_an_environment_whose_close_raises_never_keeps_the_batchs_other_slots(tokenizer):
    """One trajectory's failing `close()` used to end the rollout's cleanup loop: the slots after it stayed held."""
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool
    from tests.envs import CloseFailsSandboxedTools

    pool = SandboxPool(SandboxConfig(timeout_s=5))
    fmt = load_format("react", CloseFailsSandboxedTools.tool_schemas())
    manager = RolloutManager(CloseFailsSandboxedTools, fmt, tokenizer, RolloutLimits(), sandbox_pool=pool)
    backend = ScriptedBackend(tokenizer, {"x": ["Final Answer: 1<|im_end|>"]})
    rows = [{"case": "ok"}, {"case": "bad"}, {"case": "ok"}, {"case": "bad"}]
    try:
        with pytest.raises(RuntimeError, match="close failed on purpose"):  # the error is not swallowed ...
            manager.rollout([case_prompt("x")] * 4, rows, backend)
        assert pool.live_slots == 0  # ... and every slot of the batch went back
    finally:
        manager.close()
        pool.close()
