"""Tasks for the toolbox, each with the tool that should answer it (`expected_tools`) and a strict answer.

Rows are `{question, answer, expected_tools, kind}`. `expected_tools` is the documented row column the
trainer's selection metrics read (`agentic_grpo.rollout_metrics`); a routing recipe maps each kind to the
sub-agent that should take it (`expected: {units: ask_units, ...}`). Answers are plain numbers or short
strings, computed by the same functions the tools use.

Train and test never share a task: each task's facts (its numbers, dates, element or word) go to one split
by a stable hash, whatever the seed, size or order of generation. Test rows are distinct and interleaved by
kind, so the first N test rows cover every kind evenly; training rows of a kind with few facts (the element
table) repeat facts in different phrasings.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from agentic_grpo.tasks import split_of
from agentic_grpo.tools.dates import days_between, weekday
from agentic_grpo.tools.facts import ELEMENTS, PROPERTIES, element_property
from agentic_grpo.tools.strings import apply
from agentic_grpo.tools.units import convert, plain

# kind -> the tool(s) that should answer it, in `agentic_grpo.tools.toolbox:Toolbox`
EXPECTED_TOOLS = {
    "arithmetic": ["calculator"],
    "units": ["convert_units"],
    "dates": ["date_calculator"],
    "lookup": ["lookup"],
    "strings": ["string_tool"],
    "python": ["python"],
}
KINDS = tuple(EXPECTED_TOOLS)

Task = tuple[str, str, str]  # (the facts that decide the split, question, answer)


def _arithmetic(rng: random.Random) -> Task:
    a, b, c = rng.randint(12, 999), rng.randint(12, 99), rng.randint(100, 9999)
    template, value = rng.choice([
        ("What is {a} * {b}?", a * b),
        ("What is {a} * {b} + {c}?", a * b + c),
        ("A box holds {b} bags of {a} beads each. How many beads are in the box?", a * b),
        ("What is {c} - {a} * {b}?", c - a * b),
    ])  # fmt: skip
    facts = f"arith:{a}*{b}" + (f":{c}" if "{c}" in template else "")  # the numbers the question shows
    return facts, template.format(a=a, b=b, c=c), str(value)


_UNIT_WORDS = {"mile": "miles", "km": "kilometers", "foot": "feet", "m": "meters", "inch": "inches", "cm": "centimeters",
               "lb": "pounds", "kg": "kilograms", "oz": "ounces", "g": "grams", "gallon": "gallons", "l": "liters",
               "cup": "cups", "ml": "milliliters", "fahrenheit": "degrees Fahrenheit", "celsius": "degrees Celsius",
               "week": "weeks", "h": "hours"}  # fmt: skip
_UNIT_PAIRS = [("mile", "km"), ("km", "mile"), ("foot", "m"), ("inch", "cm"), ("lb", "kg"), ("kg", "lb"),
               ("oz", "g"), ("gallon", "l"), ("cup", "ml"), ("fahrenheit", "celsius"), ("celsius", "fahrenheit"),
               ("week", "h")]  # fmt: skip


def _units(rng: random.Random) -> Task:
    source, target = rng.choice(_UNIT_PAIRS)
    value = rng.randint(2, 250)
    template = rng.choice(["How many {t} are {v} {s}?", "Convert {v} {s} to {t}.", "What is {v} {s} in {t}?"])
    question = template.format(v=value, s=_UNIT_WORDS[source], t=_UNIT_WORDS[target])
    return f"units:{source}:{target}:{value}", question, plain(convert(value, source, target))


def _random_date(rng: random.Random) -> str:
    return (dt.date(2000, 1, 1) + dt.timedelta(days=rng.randint(0, 365 * 30))).isoformat()


def _dates(rng: random.Random) -> Task:
    start = _random_date(rng)
    if rng.random() < 0.5:
        end = (dt.date.fromisoformat(start) + dt.timedelta(days=rng.randint(20, 900))).isoformat()
        template = rng.choice(
            ["How many days are there from {s} to {e}?", "How many days passed between {s} and {e}?"]
        )
        return f"dates:{start}:{end}", template.format(s=start, e=end), str(days_between(start, end))
    template = rng.choice(["What day of the week was {s}?", "On which weekday did {s} fall?"])
    return f"weekday:{start}", template.format(s=start), weekday(start)


def _lookup(rng: random.Random) -> Task:
    name, prop = rng.choice(list(ELEMENTS)), rng.choice(list(PROPERTIES))
    template = rng.choice(["What is the {p} of {n}?", "In the element table, what is the {p} of {n}?",
                           "Give the {p} of the element {n}."])  # fmt: skip
    shown = "chemical symbol" if prop == "symbol" else prop
    return f"lookup:{name}:{prop}", template.format(p=shown, n=name), element_property(name, prop)


def _pseudo_word(rng: random.Random) -> str:
    letters = [rng.choice("bcdfgklmnprstvz") if i % 2 == 0 else rng.choice("aeiou") for i in range(rng.randint(6, 9))]
    return "".join(letters)


def _strings(rng: random.Random) -> Task:
    word = _pseudo_word(rng)
    operation, template = rng.choice([
        ("reverse", "What is the word '{w}' spelled backwards?"),
        ("reverse", "Reverse the letters of '{w}'."),
        ("length", "How many letters does the word '{w}' have?"),
        ("count_vowels", "How many vowels are in the word '{w}'?"),
    ])  # fmt: skip
    return f"strings:{operation}:{word}", template.format(w=word), apply(operation, word)


def _primes_below(n: int) -> int:
    return sum(all(k % d for d in range(2, math.isqrt(k) + 1)) for k in range(2, n))


def _python(rng: random.Random) -> Task:
    choice = rng.randrange(3)
    if choice == 0:
        n = rng.randint(100, 3000)
        return f"primes:{n}", f"How many prime numbers are smaller than {n}?", str(_primes_below(n))
    if choice == 1:
        n = rng.randint(30, 300)
        return (
            f"digits:{n}",
            f"What is the sum of the decimal digits of 2 to the power {n}?",
            str(sum(map(int, str(2**n)))),
        )
    n, a, b = rng.randint(200, 5000), rng.choice([3, 4, 6]), rng.choice([5, 7, 11])
    question = f"How many whole numbers from 1 to {n} are divisible by {a} or by {b}?"
    return f"multiples:{n}:{a}:{b}", question, str(sum(1 for k in range(1, n + 1) if k % a == 0 or k % b == 0))


GENERATORS: dict[str, Callable[[random.Random], Task]] = {
    "arithmetic": _arithmetic, "units": _units, "dates": _dates, "lookup": _lookup, "strings": _strings,
    "python": _python,
}  # fmt: skip


def toolbox_tasks(
    num_train: int = 2000,
    num_test: int = 48,
    seed: int = 0,
    kinds: list[str] | tuple[str, ...] = KINDS,
    expected: dict[str, str | list[str]] | None = None,
    test_fraction: float = 0.2,
) -> dict[str, list[dict[str, Any]]]:
    """Rows `{question, answer, expected_tools, kind}` for train and test, the kinds in turn.

    Args:
        kinds: which task kinds (`arithmetic`, `units`, `dates`, `lookup`, `strings`, `python`).
        expected: kind -> the tool or sub-agent name(s) that should answer it, instead of the toolbox's tool
            (a routing recipe names its specialists here).
        test_fraction: the share of each kind's facts that belong to the test split.
    """
    unknown = sorted(set(kinds) - set(GENERATORS))
    if unknown or not kinds:
        raise ValueError(f"toolbox_tasks: unknown kind(s) {unknown or kinds}; kinds: {list(GENERATORS)}")
    names = {kind: EXPECTED_TOOLS[kind] for kind in kinds}
    for kind, value in (expected or {}).items():
        if kind not in names:
            raise ValueError(f"toolbox_tasks: `expected` names kind `{kind}`, which is not among {list(kinds)}")
        names[kind] = [value] if isinstance(value, str) else list(value)
    rng = random.Random(seed)
    per_kind = {split: math.ceil(wanted / len(kinds)) for split, wanted in (("train", num_train), ("test", num_test))}
    drawn: dict[str, dict[str, list[dict[str, Any]]]] = {"train": {}, "test": {}}
    for kind in kinds:
        rows: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
        test_facts: set[str] = set()
        for _ in range(200 * (per_kind["train"] + per_kind["test"]) + 1000):
            if all(len(rows[s]) >= per_kind[s] for s in rows):
                break
            facts, question, answer = GENERATORS[kind](rng)
            split = split_of(f"toolbox:{facts}", test_fraction)
            if len(rows[split]) >= per_kind[split] or (split == "test" and facts in test_facts):
                continue
            if split == "test":
                test_facts.add(facts)
            rows[split].append({"question": question, "answer": answer, "expected_tools": names[kind], "kind": kind})
        if any(len(rows[s]) < per_kind[s] for s in rows):
            raise ValueError(f"toolbox_tasks: cannot draw {per_kind['test']} distinct test tasks of kind `{kind}` "
                             "(too few facts): lower num_test or raise test_fraction")  # fmt: skip
        for split in rows:
            drawn[split][kind] = rows[split]
    # The kinds come in turn; each kind drew the same number of rows, so none runs out early.
    return {
        split: _follow(kinds, drawn[split], wanted) for split, wanted in (("train", num_train), ("test", num_test))
    }


def _follow(pattern: list[str] | tuple[str, ...], rows: dict[str, list[dict[str, Any]]], wanted: int) -> list[dict]:
    """Each kind's rows in turn as `pattern` names them, repeated, until `wanted` rows or a kind runs out."""
    left = {kind: iter(kind_rows) for kind, kind_rows in rows.items()}
    ordered: list[dict[str, Any]] = []
    for kind in itertools.islice(itertools.cycle(pattern), wanted):
        row = next(left[kind], None)
        if row is None:
            break
        ordered.append(row)
    return ordered
