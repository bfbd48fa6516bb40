"""House rules for the core package `agentic_grpo/`, checked on its source text (no model, no imports of it).

- No import circle between its modules: every import counts, at module level, inside functions and under
  `TYPE_CHECKING` alike, since a circle hidden in a function is still a circle in the design.
- No module imports another module's private (`_name`) names.
- The core never imports the plug-in packages that pyproject.toml installs from top-level folders
  (`agentic_grpo.tools` from tools/, `agentic_grpo.rewards` from rewards/, ...): they build on the core,
  not the other way round; the core names them only as strings a recipe can override.
- Comments, docstrings and other string literals carry no benchmark figures or run history: those belong
  in RESULTS.md and benchmarks/RUNS.md, and the code says what it does and why.

The checkers are plain functions of source text, so the tests at the bottom plant violations in them.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CORE = "agentic_grpo"


# --- the module map ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    source: str
    is_package: bool  # an __init__.py: relative imports resolve against the package itself
    label: str  # the path the report names


def core_modules(root: Path = ROOT, package: str = CORE) -> dict[str, Module]:
    """Every module of the package folder, by dotted name; a package is its __init__ module."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = Module(path.read_text(encoding="utf-8"), is_package, str(path.relative_to(root)))
    return modules


def plugin_packages(root: Path = ROOT, package: str = CORE) -> set[str]:
    """The dotted names pyproject.toml installs from folders outside the package folder, and those folders
    as top-level names (with the repository root on sys.path, `tools.x` is the same code)."""
    with open(root / "pyproject.toml", "rb") as f:
        package_dir = tomllib.load(f).get("tool", {}).get("setuptools", {}).get("package-dir", {})
    names = set()
    for dotted, folder in package_dir.items():
        if dotted.startswith(package + ".") and not Path(folder).parts[0] == package:
            names.update({dotted, ".".join(Path(folder).parts)})
    return names


# --- imports -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    importer: str
    module: str  # the module named by `import X` or `from X import ...`, relative imports resolved
    names: tuple[str, ...]  # what `from X import` takes; () for `import X`
    line: int


def imports_of(name: str, module: Module) -> list[Import]:
    """Every import statement of the module, wherever it sits in the file."""
    found = []
    for node in ast.walk(ast.parse(module.source, module.label)):
        if isinstance(node, ast.Import):
            found += [Import(name, alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if module.is_package else name.rpartition(".")[0]
                package = ".".join(package.split(".")[: len(package.split(".")) - (node.level - 1)])
                base = f"{package}.{base}" if base else package
            found.append(Import(name, base, tuple(alias.name for alias in node.names), node.lineno))
    return found


def targets(imp: Import, modules: dict[str, Module]) -> set[str]:
    """The modules of the map an import runs: `from pkg import sub` runs pkg.sub, `from pkg import name`
    runs pkg (its __init__), `import a.b.c` runs the longest prefix that is a module."""
    if not imp.names:
        parts = imp.module.split(".")
        prefixes = [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
        return {next((p for p in prefixes if p in modules), None)} - {None}
    found = set()
    for taken in imp.names:
        if f"{imp.module}.{taken}" in modules:
            found.add(f"{imp.module}.{taken}")
        elif imp.module in modules:
            found.add(imp.module)
    return found


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, list[int]]]:
    """importer -> {imported module -> lines}, only between modules of the map, no self-imports."""
    graph: dict[str, dict[str, list[int]]] = {name: {} for name in modules}
    for name, module in modules.items():
        for imp in imports_of(name, module):
            for target in targets(imp, modules) - {name}:
                graph[name].setdefault(target, []).append(imp.line)
    return graph


def strongly_connected(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def shortest_cycle(graph: dict[str, dict[str, list[int]]], component: list[str]) -> list[str]:
    """One circle through the component's first module, by breadth-first search inside the component."""
    start, inside = component[0], set(component)
    came_from = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return path[::-1] + [start]
                if child in inside and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return component


def import_cycles(modules: dict[str, Module]) -> list[str]:
    """One report per circle: a path around it, then every import inside it (file:line)."""
    graph = import_graph(modules)
    reports = []
    for component in strongly_connected(graph):
        lines = [" -> ".join(shortest_cycle(graph, component))]
        for importer in component:
            for target, at in sorted(graph[importer].items()):
                if target in component:
                    where = ", ".join(f"{modules[importer].label}:{line}" for line in at)
                    lines.append(f"    {importer} imports {target} ({where})")
        reports.append("\n".join(lines))
    return reports


def private_imports(modules: dict[str, Module], package: str = CORE) -> list[str]:
    """`from agentic_grpo.a import _b` in any module but `agentic_grpo.a` itself (dunders are public)."""
    hits = []
    for name, module in modules.items():
        for imp in imports_of(name, module):
            if imp.module.split(".")[0] != package or imp.module == name:
                continue
            for taken in imp.names:
                if taken.startswith("_") and not (taken.startswith("__") and taken.endswith("__")):
                    hits.append(f"{module.label}:{imp.line}: from {imp.module} import {taken}")
            if not imp.names and any(part.startswith("_") and not part.startswith("__")
                                     for part in imp.module.split(".")):  # fmt: skip
                hits.append(f"{module.label}:{imp.line}: import {imp.module}")
    return hits


def plugin_imports(modules: dict[str, Module], plugins: set[str]) -> list[str]:
    """Imports of a plug-in package (or anything in it) from the core."""
    hits = []
    for name, module in modules.items():
        for imp in imports_of(name, module):
            named = [imp.module] + [f"{imp.module}.{taken}" for taken in imp.names]
            if any(n == p or n.startswith(p + ".") for n in named for p in plugins):
                what = f"from {imp.module} import {', '.join(imp.names)}" if imp.names else f"import {imp.module}"
                hits.append(f"{module.label}:{imp.line}: {what}")
    return hits


# --- figures and run history in text -----------------------------------------------------------------

ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
FIGURES = {
    # 41.7%, 74 %: a measured share (format specs such as `{x:.1%}` and `%d%%` do not match)
    "percentage": re.compile(r"(?<![\w.%{:])\d+(?:\.\d+)?\s?%(?!\w)"),
    # +35.4, −2.1: a change between runs (exponents such as 1e+6 do not match)
    "signed figure": re.compile(r"(?<![\w.])[+−]\d+\.\d+(?!\d)"),
    "points": re.compile(r"\b\d+(?:\.\d+)?\s*(?:percentage\s+)?(?:points?|pp)\b", re.I),
    # seed 2, seeds 0, 1, 2 (a `--seed 1` flag or `seed=0` key does not match)
    "seeds": re.compile(r"(?<![-_=&?`])\bseeds?\s+\d+(?:\s*(?:,|/|and|or)\s*\d+)*", re.I),
    "counted outcome": re.compile(r"\b(?:in\s+)?\d+\s+of\s+(?:the\s+)?\d+\b(?!\s*[-+*/])"),
    "change to a figure": re.compile(
        r"\b(?:fell|rose|dropped|climbed|jumped|went|moved|improved|regressed)\s+(?:from\s+\S+\s+)?to\s+[+−-]?\d",
        re.I,
    ),
    "speed-up": re.compile(r"\b\d+(?:\.\d+)?\s*(?:x|×|times)\s+(?:faster|slower|fewer|more|less)\b", re.I),
    "rate": re.compile(r"\b\d+(?:\.\d+)?\s*(?:/s|it/s|tok/s|steps/s|tokens/s)(?!\w)"),
    # a commit: 7-40 lowercase hex characters with a digit and a letter, as a word
    "commit hash": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "numbered run": re.compile(rf"\bthe\s+{ORDINAL}\s+(?:run|recipe run|attempt|seed)s?\b", re.I),
    "run log": re.compile(r"\bRUNS\.md\b"),
    "measured": re.compile(
        r"\b(?:we|I)\s+measured\b|\bmeasured\s*(?::|\(|here\b|there\b|once\b|earlier\b|before\b)"
        r"|\bmeasured\s+on\s+(?:the\s+|a\s+)?(?:toolbox|cpu|gpu|h100|h200|demo|benchmark|seed)",
        re.I,
    ),
    "tried": re.compile(
        r"\b(?:we|I)\s+tried\b|\btried\s+(?:and|but|it|this|that|once|earlier|before)\b"
        r"|\b(?:was|were)\s+tried\s+(?:on|in|with|before|earlier)\b",
        re.I,
    ),
    "not kept": re.compile(r"\bnot\s+kept\b", re.I),
    "on the toolbox": re.compile(r"\bon\s+the\s+toolbox\b", re.I),
}


def text_pieces(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every comment and string literal (docstrings, help strings, messages)."""
    kinds = {tokenize.COMMENT, tokenize.STRING}
    kinds |= {tokenize.FSTRING_MIDDLE} if hasattr(tokenize, "FSTRING_MIDDLE") else set()
    return [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type in kinds
    ]


def figure_hits(source: str, label: str) -> list[str]:
    """`label:line: kind: 'match'` for each figure or piece of run history in the source's text."""
    hits = []
    for first_line, text in text_pieces(source):
        for kind, pattern in FIGURES.items():
            for match in pattern.finditer(text):
                line = first_line + text.count("\n", 0, match.start())
                hits.append(f"{label}:{line}: {kind}: {match.group(0)!r}")
    return sorted(set(hits), key=lambda hit: (hit.split(":")[0], int(hit.split(":")[1]), hit))


# --- the rules, on the checkout ------------------------------------------------------------------------


def test_no_import_circle_in_the_core():
    modules = core_modules()
    assert "agentic_grpo.sandbox.pool" in modules and modules["agentic_grpo.sandbox"].is_package
    cycles = import_cycles(modules)
    for report in cycles:
        print(report)
    private = private_imports(modules)
    plugins = plugin_packages()
    assert {"agentic_grpo.tools", "agentic_grpo.rewards"} <= plugins
    from_plugins = plugin_imports(modules, plugins)
    problems = (
        [f"import circle: {report}" for report in cycles]
        + [f"private name of another module: {hit}" for hit in private]
        + [f"the core imports a plug-in package: {hit}" for hit in from_plugins]
    )
    assert not problems, "\n".join(problems)


def test_no_benchmark_figures_or_history_in_the_core():
    hits = [hit for name, module in core_modules().items() for hit in figure_hits(module.source, module.label)]
    for hit in hits:
        print(hit)
    assert not hits, "figures or run history in agentic_grpo/ (they belong in RESULTS.md / benchmarks/RUNS.md):\n" + (
        "\n".join(hits)
    )


# --- the checkers catch planted violations ---------------------------------------------------------------


def planted(**files: str) -> dict[str, Module]:
    """A module map from `dotted__name=source` (`__` for dots; a trailing `__init` makes a package)."""
    modules = {}
    for key, source in files.items():
        parts = key.split("__")
        is_package = parts[-1] == "init"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = Module(source, is_package, "/".join(parts) + ".py")
    return modules


def test_the_checkers_catch_planted_violations():
    modules = planted(
        agentic_grpo__init="",
        agentic_grpo__box__init="from .pool import Pool\n",
        agentic_grpo__box__pool="from .slot import Slot\nclass Pool: ...\n",
        agentic_grpo__box__slot="def f():\n    from agentic_grpo.box.pool import Pool\n",
        agentic_grpo__a="from agentic_grpo.b import _helper, __version__\n",
        agentic_grpo__b="_helper = 1\n__version__ = '1'\n",
        agentic_grpo__c="import agentic_grpo.rewards.rules\nfrom agentic_grpo import tools\n",
        agentic_grpo__d="import tools.calculator\nCALC = 'agentic_grpo.tools.calculator:Calculator'\n",
    )
    cycles = import_cycles(modules)
    assert len(cycles) == 1, cycles
    assert cycles[0].splitlines()[0] == "agentic_grpo.box.pool -> agentic_grpo.box.slot -> agentic_grpo.box.pool"
    assert "agentic_grpo/box/slot.py:2" in cycles[0]
    # the package re-exporting its modules is no circle
    assert all("agentic_grpo.box imports" not in line for line in cycles[0].splitlines())

    assert private_imports(modules) == ["agentic_grpo/a.py:1: from agentic_grpo.b import _helper"]
    plugins = {"agentic_grpo.tools", "agentic_grpo.rewards", "tools", "rewards"}
    assert plugin_imports(modules, plugins) == [
        "agentic_grpo/c.py:1: import agentic_grpo.rewards.rules",
        "agentic_grpo/c.py:2: from agentic_grpo import tools",
        "agentic_grpo/d.py:1: import tools.calculator",
    ]

    fixed = {**modules, **planted(agentic_grpo__box__slot="from typing import Any\n")}
    assert import_cycles(fixed) == []


def test_relative_imports_resolve_against_the_package():
    modules = planted(
        agentic_grpo__init="",
        agentic_grpo__x__init="from . import y\nfrom ..z import Z\n",
        agentic_grpo__x__y="from .. import z\nfrom . import w\n",
        agentic_grpo__x__w="",
        agentic_grpo__z="from agentic_grpo.x import y\n",
    )
    graph = import_graph(modules)
    assert graph["agentic_grpo.x"] == {"agentic_grpo.x.y": [1], "agentic_grpo.z": [2]}
    assert graph["agentic_grpo.x.y"] == {"agentic_grpo.z": [1], "agentic_grpo.x.w": [2]}
    cycles = [report.splitlines()[0] for report in import_cycles(modules)]
    assert cycles == ["agentic_grpo.x.y -> agentic_grpo.z -> agentic_grpo.x.y"]


def test_the_figure_checker_catches_planted_history_and_passes_code():
    source = '''"""Reads contexts once.

On the toolbox (seeds 0, 1, 2) selection rose to 41.7% (+35.4 over the fifth run; see benchmarks/RUNS.md).
"""

# measured here: 64 slots at 52/s; tried and not kept in 3f9c2ab.
HELP = "strict accuracy fell to 4.2 points on seed 2; 7 of 24 rows"


def f(seed: int = 0, scale: float = 0.5, eps: float = 1e+6) -> str:
    """Draws with `seed` (e.g. `--seed 1`, `seed=0`); the measured KL; each layer is tried for real (1e+6 steps)."""
    share = 0.25  # of the batch
    return f"{share:.1%} {seed} %d%%" % 3 + "#1f77b4 deadbeef 1.0 -1.5"
'''
    hits = figure_hits(source, "planted.py")
    kinds = {hit.split(": ")[1] for hit in hits}
    assert kinds == {
        "on the toolbox", "seeds", "change to a figure", "percentage", "signed figure", "numbered run", "run log",
        "measured", "rate", "tried", "not kept", "commit hash", "points", "counted outcome",
    }, hits  # fmt: skip
    assert {int(hit.split(":")[1]) for hit in hits} == {3, 6, 7}, hits
    assert "planted.py:3: percentage: '41.7%'" in hits and "planted.py:6: commit hash: '3f9c2ab'" in hits
