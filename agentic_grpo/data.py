"""Recipe data: load or generate rows, check their columns, and add the chat prompt.

`datasets` does the loading; this module only turns a recipe's `dataset:` spec into
train and test `Dataset`s and fails at start-up, naming the column, when rows lack
what the run needs.

Generated data (`generator:` or `reasoning_gym:`) has two seeds. `seed` draws the test split:
fixed (default 0), so held-out figures stay comparable across runs; knowing it reveals only
evaluation answers, never trained on. `train_seed` draws the training split: a per-run secret
unless the recipe sets it (`with_training_seed`), recorded in `run.json`, so a policy cannot
regenerate its training rows from the recipe and print their answers. `train_seed` equal to
`seed` draws the training rows of versions that had no `train_seed`.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, load_dataset

from agentic_grpo.plugins import check_options, import_object


def _seed_parameter(generator: Any) -> inspect.Parameter | None:
    try:
        return inspect.signature(generator).parameters.get("seed")
    except (TypeError, ValueError):
        return None


def _test_seed(spec: dict[str, Any], generator: Any = None) -> int:
    """The seed of the test split: the recipe's, else the generator's default."""
    if "seed" in spec:
        return int(spec["seed"])
    if generator is None and "generator" in spec:
        generator = import_object(spec["generator"], what="dataset generator")
    parameter = _seed_parameter(generator) if generator is not None else None
    return parameter.default if parameter is not None and isinstance(parameter.default, int) else 0


def _shared_secret() -> int:
    """A random seed, the same in every process of a distributed run (rank 0's, broadcast)."""
    seed = secrets.randbelow(2**31)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            from accelerate import PartialState

            PartialState()  # the process group the Trainer would start anyway
        box = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = int(box[0])
    return seed


def with_training_seed(spec: Any, resume_from: str | Path | None = None) -> Any:
    """`spec` with `train_seed` decided, for generated data whose recipe does not set it; other specs as given.

    Resuming (`resume_from`: the checkpoint, or the run's output_dir) reuses the seed the interrupted run recorded:
    in the checkpoint, else in the `run.json` of the run it belongs to. Where none is found, resuming is refused: it
    would train on other rows. Otherwise the seed is a fresh secret, shared by all processes.
    """
    if not isinstance(spec, dict) or spec.get("train_seed") is not None:
        return spec
    if "reasoning_gym" not in spec:
        if "generator" not in spec:
            return spec
        if _seed_parameter(import_object(spec["generator"], what="dataset generator")) is None:
            return spec  # a generator without a seed draws what it draws
    if resume_from is None:
        return {**spec, "train_seed": _shared_secret()}
    seed = recorded_training_seed(resume_from)
    if seed is None:
        raise ValueError(
            f"resuming from `{resume_from}`, but neither it nor its run's directory records the training seed "
            "(run.json: dataset.train_seed), so the resumed run would train on other rows: resume from a checkpoint "
            "inside the interrupted run's output_dir, or set `dataset.train_seed` to the interrupted run's seed"
        )
    return {**spec, "train_seed": seed}


def recorded_training_seed(model_path: str | Path) -> int | None:
    """The training seed a run recorded (`run.json`: `dataset.train_seed`), for its output directory or a checkpoint
    in it; None for anything else (a hub model, a run of generated data with a fixed seed, a run that kept none)."""
    for folder in (Path(model_path), Path(model_path).parent):
        path = folder / "run.json"
        if path.is_file():
            dataset = json.loads(path.read_text()).get("dataset")
            seed = dataset.get("train_seed") if isinstance(dataset, dict) else None
            return None if seed is None else int(seed)
    return None


def shared_training_seed(recipe: dict[str, Any], store: str | Path) -> dict[str, Any]:
    """`recipe` with one `train_seed` for every run of a comparison (benchmark arms train on the same rows).

    Drawn once and kept in the file `store`, so a later invocation that reuses finished runs draws no other.
    A recipe that sets its own `train_seed`, or has no generated data, is returned as it is.
    """
    dataset = recipe.get("dataset")
    if not isinstance(dataset, dict) or dataset.get("train_seed") is not None:
        return recipe
    path = Path(store)
    if path.is_file():
        decided = {**dataset, "train_seed": int(path.read_text())}
    else:
        decided = with_training_seed(dataset)
        if decided.get("train_seed") is not None:
            path.write_text(f"{decided['train_seed']}\n")
    return {**recipe, "dataset": decided}


def _generated(generator: Any, spec: dict[str, Any], train_seed: int | None) -> dict[str, list[dict[str, Any]]]:
    """A generator's splits: test rows from `seed`, training rows from `train_seed` (when it differs)."""
    splits = generator(**spec)
    if train_seed is None or train_seed == _test_seed(spec, generator):
        return splits
    test = splits.get("test", [])
    held = {row.get("question") for row in test}
    # Any generator, even one that does not split by a hash: a test question never becomes a training row.
    train = [row for row in generator(**{**spec, "seed": train_seed})["train"] if row.get("question") not in held]
    return {"train": train, "test": test}


def load_task_data(spec: dict[str, Any] | str | None) -> tuple[Dataset, Dataset | None]:
    """Train and (optional) test datasets for a recipe's `dataset` field.

    Generated data whose spec sets no `train_seed` gets a fresh secret one (`with_training_seed`): a run that
    must know it passes the spec through `with_training_seed` first and records it.
    """
    if spec is None:
        raise ValueError(
            "recipe field `dataset` is missing: give `{generator: ...}`, `{reasoning_gym: TASK, ...}` or "
            "`{path: json, data_files: ...}`"
        )
    if isinstance(spec, str):
        spec = {"path": spec}
    spec = dict(with_training_seed(spec))
    if "reasoning_gym" in spec:
        from agentic_grpo.reasoning_gym_tasks import DATASET_KEYS, reasoning_gym_splits

        unknown = sorted(set(spec) - set(DATASET_KEYS))
        if unknown:
            raise ValueError(
                f"recipe `dataset` for a reasoning-gym task: unknown key(s) {unknown}; keys: {DATASET_KEYS}"
            )
        splits = reasoning_gym_splits(**spec)
        train, test = Dataset.from_list(splits["train"]), Dataset.from_list(splits["test"])
        return train, (test if len(test) else None)
    if "generator" in spec:
        path = spec.pop("generator")
        generator = import_object(path, what="dataset generator")
        train_seed = spec.pop("train_seed", None)
        if train_seed is not None and _seed_parameter(generator) is None:
            raise ValueError(f"recipe `dataset`: `train_seed` is set, but generator `{path}` takes no `seed`")
        check_options(generator, spec, f"recipe `dataset` generator `{path}`")
        splits = _generated(generator, spec, train_seed)
        train, test = Dataset.from_list(splits["train"]), Dataset.from_list(splits.get("test", []))
        return train, (test if len(test) else None)
    test_split = spec.pop("test_split", None)
    split = spec.pop("split", "train")
    check_load_dataset_options(spec)
    if spec.get("path") == "json":
        check_json_files(spec.get("data_files"), "recipe `dataset`")
    try:
        loaded = load_dataset(**spec)
    except Exception as exc:  # noqa: BLE001 - one message naming the spec beats a datasets traceback
        raise ValueError(f"recipe `dataset` {spec} cannot be loaded: {reasons(exc)}") from exc
    if isinstance(loaded, DatasetDict):
        test = loaded.get("test")
        loaded = loaded[split]
    else:
        test = None
    if test_split:
        parts = loaded.train_test_split(test_size=test_split, seed=0)
        loaded, test = parts["train"], parts["test"]
    return loaded, test


def reasons(exc: BaseException) -> str:
    """What went wrong, down the exception's chain of causes (`datasets` wraps the parse error that says where)."""
    found, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        found.append(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        exc = exc.__cause__ or exc.__context__
    return "; caused by ".join(found)


def check_json_files(data_files: Any, where: str) -> None:
    """Each local JSON-lines file among `data_files` (a path, a list, or a {split: path(s)} mapping), read before
    `datasets` reads it: an empty file, or a line that is not a JSON object, is named with its line number."""
    if isinstance(data_files, dict):
        paths = [p for value in data_files.values() for p in ([value] if isinstance(value, str) else value)]
    else:
        paths = [data_files] if isinstance(data_files, str) else list(data_files or [])
    for path in map(Path, paths):
        if not path.is_file() or path.suffix not in (".jsonl", ".json"):
            continue  # a pattern, a remote file or another format: `datasets` says what is wrong with those
        text = path.read_text(errors="replace")
        if not text.strip():
            raise ValueError(f"{where}: data file `{path}` is empty: it needs one JSON object per line")
        if path.suffix == ".json" and text.lstrip()[:1] != "{":
            continue  # a JSON document (a list of rows), which `datasets` reads whole
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: data file `{path}` line {number} is not JSON ({exc.msg}, column "
                                 f"{exc.colno}): one JSON object per line") from exc  # fmt: skip
            if not isinstance(row, dict):
                raise ValueError(f"{where}: data file `{path}` line {number} is a JSON {type(row).__name__}, not an "
                                 "object of columns")  # fmt: skip


def check_load_dataset_options(spec: dict[str, Any]) -> None:
    """A key that is not an argument of `load_dataset` but close to one is a typo (`data_file`); other unknown keys
    go on to the dataset builder's config, as `load_dataset` passes them."""
    import difflib
    import inspect

    parameters = inspect.signature(load_dataset).parameters
    known = [n for n, p in parameters.items() if p.kind is not p.VAR_KEYWORD] + ["test_split"]
    for key in spec:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        if key not in known and close:
            raise ValueError(f"recipe `dataset`: option `{key}` is not known; did you mean `{close[0]}`?")


def check_columns(dataset: Dataset, required: list[str], where: str) -> None:
    missing = [c for c in required if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{where} rows lack column(s) {missing}; they have {dataset.column_names}. Rename columns in the data "
            "(every row needs `question`, the task the agent is given), or choose rewards that do not need them."
        )
    if len(dataset) == 0:
        raise ValueError(f"{where} is empty")


def add_prompts(dataset: Dataset, trajectory_format: Any, environment: Any = None) -> Dataset:
    """Add the conversational `prompt` column TRL expects, as the format opens a trajectory (`row_prompt`)."""
    return dataset.map(lambda row: {"prompt": row_prompt(trajectory_format, row, environment)})


def row_prompt(trajectory_format: Any, row: dict[str, Any], environment: Any = None) -> list[dict[str, str]]:
    """The messages a trajectory on `row` opens with. Where rows choose among several environments (`environment`
    an `agentic_grpo.trl_environment.EnvironmentOfRow` class), the system prompt describes the tools of the one
    the row names, as TRL shows each example its own environment's tools."""
    from agentic_grpo.trl_environment import ENVIRONMENT_COLUMN

    messages = trajectory_format.prompt_messages(str(row["question"]))
    classes = getattr(environment, "classes", None)
    if classes is None:
        return messages
    name = row.get(ENVIRONMENT_COLUMN)
    if name not in classes:
        raise ValueError(f"a row's `{ENVIRONMENT_COLUMN}` is {name!r}; the environments are {sorted(classes)}")
    own = trajectory_format.system_prompt(classes[name].tool_schemas())
    return [{**m, "content": own} if m["role"] == "system" else m for m in messages]
