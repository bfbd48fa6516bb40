"""ReAct parsing: valid, partial and malformed turns; fuzzed, the parser never raises."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_grpo.formats import FinalAnswer, Malformed, load_format
from agentic_grpo.tools.calculator import Calculator
from agentic_grpo.trajectory import ToolCall, ToolResult

FMT = load_format("react", Calculator.tool_schemas())


def test_action_with_json_input():
    parsed = FMT.parse('Thought: x\nAction: calculator\nAction Input: {"expression": "3 * 4"}\nObservation:')
    assert parsed == ToolCall("calculator", {"expression": "3 * 4"}, parsed.raw_text)
    assert parsed.raw_text.startswith("Action: calculator")


def test_action_input_in_code_fence_and_with_trailing_text():
    parsed = FMT.parse('Action: `calculator`\nAction Input: ```json\n{"expression": "1+1"}\n``` then I wait')
    assert isinstance(parsed, ToolCall) and parsed.arguments == {"expression": "1+1"}


def test_bare_value_fills_a_single_argument_tool():
    parsed = FMT.parse("Action: calculator\nAction Input: 12 * 7\n")
    assert isinstance(parsed, ToolCall) and parsed.arguments == {"expression": "12 * 7"}


def test_final_answer_stops_at_the_next_marker():
    assert FMT.parse("Thought: done\nFinal Answer: 56088\nThought: extra") == FinalAnswer("56088")


def test_first_of_action_and_final_answer_wins():
    assert isinstance(FMT.parse("Final Answer: 3\nAction: calculator\nAction Input: {}"), FinalAnswer)
    parsed = FMT.parse('Action: calculator\nAction Input: {"expression": "1"}\nFinal Answer: 3')
    assert isinstance(parsed, ToolCall)


def test_partial_and_malformed_turns():
    assert isinstance(FMT.parse("Action: calculator"), Malformed)  # no Action Input
    assert isinstance(FMT.parse("Action:\nAction Input: {}"), Malformed)  # no tool name
    assert isinstance(FMT.parse("Thought: I should think more"), Malformed)  # neither action nor answer
    assert isinstance(FMT.parse("Final Answer:   "), Malformed)  # empty answer
    assert "JSON object" in FMT.parse("Action: other\nAction Input: not json").reason


def test_unknown_tool_is_parsed_for_the_environment_to_reject():
    parsed = FMT.parse('Action: search\nAction Input: {"q": "x"}')
    assert isinstance(parsed, ToolCall) and parsed.name == "search"


def test_system_prompt_lists_tools_arguments_and_examples():
    fmt = load_format("react", Calculator.tool_schemas(), examples=["Question: q\nFinal Answer: a"])
    prompt = fmt.system_prompt()
    assert '- calculator: Evaluate an arithmetic expression exactly. Arguments: {"expression": string}' in prompt
    assert "one of [calculator]" in prompt and "Example:\nQuestion: q" in prompt


def test_observation_rendering():
    assert FMT.render_observation(ToolResult("42"), after_stop=True) == " 42\n"
    assert FMT.render_observation(ToolResult("42"), after_stop=False) == "\nObservation: 42\n"


react_words = st.sampled_from(
    ["Thought:", "Action:", "Action Input:", "Observation:", "Final Answer:", "calculator", "{", "}", '"', ":",
     "\n", " ", "```", "json", '{"expression": "1+2"}', "[", "]", "null", "1e999", "\\u0000"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(react_words, st.text(max_size=12)), max_size=30))
def test_parser_never_raises_on_fuzzed_text(parts):
    parsed = FMT.parse("".join(parts))
    assert isinstance(parsed, (ToolCall, FinalAnswer, Malformed))
    if isinstance(parsed, ToolCall):
        assert isinstance(parsed.arguments, dict) and parsed.name


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parser_never_raises_on_arbitrary_text(text):
    assert isinstance(FMT.parse(text), (ToolCall, FinalAnswer, Malformed))


def test_native_tool_call_format_parses_calls_and_answers():
    from agentic_grpo.tools.toolbox import MathToolbox

    fmt = load_format("tool_call", MathToolbox.tool_schemas(), answer_pattern=r"Answer:\s*(.+)")
    assert '"name": "calculator"' in fmt.system_prompt() and '"name": "python"' in fmt.system_prompt()
    call = fmt.parse('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>')
    assert call == ToolCall("calculator", {"expression": "2*3"}, call.raw_text)
    double = fmt.parse('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    assert double.arguments == {"code": "print(1)"}
    assert fmt.parse("So. Answer: 6") == FinalAnswer("6")
    assert isinstance(fmt.parse("I am not sure."), Malformed)  # no call and no answer line
    assert isinstance(fmt.parse("<tool_call>{not json}</tool_call>"), Malformed)
    assert fmt.render_observation(ToolResult("6"), after_stop=False) == "<tool_response>\n6\n</tool_response>"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_native_tool_call_parser_never_raises(text):
    fmt = load_format("tool_call", Calculator.tool_schemas())
    assert isinstance(fmt.parse("<tool_call>" + text), (ToolCall, FinalAnswer, Malformed))
