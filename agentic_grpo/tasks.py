"""Generated tasks with verifiable answers, split so train and test never share a problem.

The CPU demo trains on multiplication hidden in short word problems: a 135M model
cannot multiply 3-digit numbers in its head, so the calculator is needed, and the
story around the numbers makes calling it something to learn. Each pair of operands
belongs to train or test by a stable hash of the pair, so no seed, size or order of
generation can put a test problem in the training set.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

_STORIES = [
    "A warehouse has {a} shelves and each shelf holds {b} boxes. How many boxes are in the warehouse?",
    "A farmer plants {a} rows of trees with {b} trees in each row. How many trees does the farmer plant?",
    "A printer prints {b} pages per hour. How many pages does it print in {a} hours?",
    "Each ticket costs {b} dollars. How many dollars do {a} tickets cost?",
    "A library has {a} boxes of books with {b} books in each box. How many books are there?",
    "A train carries {b} passengers on each trip. How many passengers does it carry in {a} trips?",
]


def split_of(key: str, test_fraction: float = 0.1) -> str:
    """`test` or `train` for a task, by a hash of its key (what makes two tasks the same: an operand pair, a
    looked-up fact) that no seed changes, so no seed ever puts a test task in a training set."""
    digest = hashlib.sha256(key.encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"


def multiplication_word_problems(
    num_train: int = 1000,
    num_test: int = 48,
    seed: int = 0,
    digits: tuple[int, int] = (3, 3),
    word_problems: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """Rows `{question, answer}` for train and test; `digits` are the operands' digit counts."""
    rng = random.Random(seed)
    low = [10 ** (d - 1) for d in digits]
    high = [10**d - 1 for d in digits]
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    wanted = {"train": num_train, "test": num_test}
    seen: set[tuple[int, int]] = set()
    attempts = 0
    while any(len(splits[k]) < wanted[k] for k in splits):
        attempts += 1
        if attempts > 100 * (num_train + num_test) + 1000:
            raise ValueError(f"cannot draw {num_train} train and {num_test} test problems with digits={digits}")
        a, b = rng.randint(low[0], high[0]), rng.randint(low[1], high[1])
        if (a, b) in seen:
            continue
        seen.add((a, b))
        split = split_of(f"{min(a, b)}x{max(a, b)}")
        if len(splits[split]) >= wanted[split]:
            continue
        if word_problems:
            question = rng.choice(_STORIES).format(a=a, b=b)
        else:
            question = f"What is {a} * {b}?"
        splits[split].append({"question": question, "answer": str(a * b)})
    return splits


_SHOP_STEPS = [
    "A shop buys {a} boxes with {b} {item} in each box",
    "then sells {c} of the {item}",
    "and prices each {item_one} that is left at {d} dollars",
]
_SHOP_ITEMS = [("pens", "pen"), ("apples", "apple"), ("cups", "cup"), ("books", "book"), ("lamps", "lamp")]


def shop_word_problems(
    num_train: int = 1000,
    num_test: int = 48,
    seed: int = 0,
    steps: list[int] | tuple[int, ...] = (2, 3),
    test_fraction: float = 0.1,
) -> dict[str, list[dict[str, Any]]]:
    """Word problems solved by two or three dependent tool calls: buy a*b items, sell c, price the rest at d.

    Rows `{question, answer, values, solution}`: `values` are the intermediate results in order (a*b, a*b-c and,
    for three steps, (a*b-c)*d; the last is the answer), which `agentic_grpo.tools.stepwise` pays a per-turn
    reward for, once each; `solution` the calculator expressions that compute them, one call each (a worked
    solution, `benchmarks/warm_start.py`). Each problem's numbers go to train or test by a hash, as in `split_of`.
    """
    rng = random.Random(seed)
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    wanted = {"train": num_train, "test": num_test}
    seen: set[tuple[int, ...]] = set()
    attempts = 0
    while any(len(splits[k]) < wanted[k] for k in splits):
        attempts += 1
        if attempts > 100 * (num_train + num_test) + 1000:
            raise ValueError(f"cannot draw {num_train} train and {num_test} test problems")
        n = rng.choice(list(steps))
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        c = rng.randint(11, a * b - 1)
        d = rng.randint(3, 9) if n == 3 else 0
        if (a, b, c, d) in seen:
            continue
        seen.add((a, b, c, d))
        digest = hashlib.sha256(f"shop:{a}x{b}-{c}x{d}".encode()).digest()
        split = "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"
        if len(splits[split]) >= wanted[split]:
            continue
        item, item_one = rng.choice(_SHOP_ITEMS)
        values = [a * b, a * b - c] + ([(a * b - c) * d] if n == 3 else [])
        solution = [f"{a} * {b}", f"{a * b} - {c}"] + ([f"{a * b - c} * {d}"] if n == 3 else [])
        story = ", ".join(_SHOP_STEPS[:n]).format(a=a, b=b, c=c, d=d, item=item, item_one=item_one)
        ask = f"How many dollars are the {item} that are left worth?" if n == 3 else f"How many {item} are left?"
        splits[split].append(
            {
                "question": f"{story}. {ask}",
                "answer": str(values[-1]),
                "values": [str(v) for v in values],
                "solution": solution,
            }
        )
    return splits
