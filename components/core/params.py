"""Reading params.yaml into the schema (components.core.config): one line per error, naming the
file and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from components.core.config import InvalidKey, Params, TaskConfig, TaskSettings
from components.core.errors import ConfigError
from components.core.packages import CHECKPOINTS

M = TypeVar("M", bound=BaseModel)
EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false", "string_type":
            "a string", "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
            "finite_number": "a finite number (not .inf or .nan)"}
# pydantic's range errors, worded as the loader words the others.
LIMITS = {"greater_than": "must be above {gt:g}", "greater_than_equal": "must be at least {ge:g}",
          "less_than": "must be below {lt:g}", "less_than_equal": "must be at most {le:g}",
          "too_short": "must hold at least {min_length} item(s)"}
# Each list or mapping of entries, and the section key holding what its entries leave out.
ENTRY_DEFAULTS = {("ingest", "sources"): "source_defaults", ("finetune", "tasks"): "task_defaults"}
# A teacher folder in transformers' layout: what components.model.checkpoint reads from it.
TEACHER_FILES = ("config.json", "model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
LAYOUT = f"{', '.join(TEACHER_FILES)}, {' or '.join(TOKENIZER_FILES)}"
MODERN_TYPE = "modernbert"  # config.json's model_type of a ModernBERT checkpoint


def load_params(path: str | Path) -> Params:
    """Read and check a params file (with `extends: other.yaml`, its differences from that one);
    ConfigError names the file and the key of a bad value."""
    from components.core.guard import check_stage_outputs

    path = Path(path)
    root = path.resolve().parent
    params = parse(Params, with_entry_defaults(_read_yaml(path)), f"{path}:", root)
    check_stage_outputs(params, root, f"{path}:")
    check_teacher(params, root, f"{path}:")
    return params


def parse(model: type[M], data: Any, where: str, root: Path | None = None) -> M:
    """`model` from plain YAML data, every key and type checked, path params normalized against the
    project `root` (config.normal_path); ConfigError names the first bad key."""
    try:
        return model.model_validate(data, context={"root": root})
    except ValidationError as e:
        error = e.errors()[0]
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
        kind, cause, value = error["type"], error.get("ctx", {}).get("error"), error.get("input")
        got = f"got {type(value).__name__} {value!r}"[:120]
        if isinstance(cause, InvalidKey):  # a cross-field rule, about a key inside the section
            key, what = ".".join(filter(None, (key, cause.key))), str(cause)
        elif kind == "greater_than" and error["ctx"]["gt"] == 0:
            what = f"must be positive, {got}"
        elif kind in LIMITS:
            what = f"{LIMITS[kind].format(**error['ctx'])}, {got}"
        elif kind == "value_error":
            what = str(cause)
        elif kind in ("missing", "extra_forbidden"):
            what = "missing required key" if kind == "missing" else \
                f"unknown key (known keys: {', '.join(_known(model, error['loc'][:-1]))})"
        elif kind == "literal_error":
            what = f"expected one of {error['ctx']['expected']}, {got}"
        else:
            what = f"expected {EXPECTED.get(kind, kind)}, {got}"
        raise ConfigError(f"{where}{key}: {what}") from None


def with_entry_defaults(data: dict) -> dict:
    """Params data with each task and corpus source given the keys it leaves out, from
    finetune.task_defaults and ingest.source_defaults: an entry's own value wins whole (its
    `columns` replace the default's, not merge with them). Data not in that shape stays as it is,
    for parse to name."""
    filled = dict(data)
    for (name, entries), defaults_key in ENTRY_DEFAULTS.items():
        section = data.get(name)
        defaults = section.get(defaults_key) if isinstance(section, dict) else None
        if not isinstance(defaults, dict):
            continue
        items = section.get(entries)
        if isinstance(items, list):
            filled[name] = {**section, entries: [_fill(defaults, e) for e in items]}
        elif isinstance(items, dict):
            filled[name] = {**section, entries: {n: _fill(defaults, e) for n, e in items.items()}}
    return filled


def _fill(defaults: dict, entry: Any) -> Any:
    """An entry with the keys it leaves out taken from `defaults` (not a mapping: as it is)."""
    return {**defaults, **entry} if isinstance(entry, dict) else entry


def check_teacher(p: Params, root: Path, where: str) -> None:
    """With the `distilled` start: distill.teacher is a packaged checkpoint or a checkpoint folder,
    and distill.student_layers are layers of it (read from its config.json, no torch)."""
    if "distilled" not in p.finetune.init:  # no stage reads the teacher
        return
    teacher, layers = p.distill.teacher, p.distill.student_layers
    if teacher in CHECKPOINTS:  # as components.model.packaged resolves it: the name first
        count, model_type = CHECKPOINTS[teacher].layers, "bert"
    else:
        count, model_type = _checkpoint_shape(root / teacher, f"{where}distill.teacher: {teacher!r}")
    if layers and model_type == MODERN_TYPE:  # a modern encoder's global layers follow their index
        raise ConfigError(f"{where}distill.student_layers: {layers}: the teacher {teacher} is a ModernBERT "
                          "encoder; only a classic one is cut (or leave student_layers empty)")
    if layers and layers[-1] >= count:
        raise ConfigError(f"{where}distill.student_layers: {layers}: the teacher {teacher} has {count} "
                          f"layers (0 to {count - 1})")


def _checkpoint_shape(folder: Path, key: str) -> tuple[int, str]:
    """A checkpoint folder's layer count and model_type, from its config.json; ConfigError (`key`
    first) when it is no folder, or not one in transformers' layout."""
    if not folder.is_dir():
        what = "a file" if folder.exists() else "missing"
        raise ConfigError(f"{key} is not a packaged checkpoint ({', '.join(CHECKPOINTS)}), nor a "
                          f"folder ({folder} is {what})")
    missing = [name for name in TEACHER_FILES if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    if missing:
        raise ConfigError(f"{key} is not a checkpoint folder in transformers' layout ({LAYOUT}): "
                          f"{folder} has no {', '.join(missing)}")
    config = folder / "config.json"
    try:
        hf = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}: {config} is not readable JSON ({e})") from None
    count = hf.get("num_hidden_layers") if isinstance(hf, dict) else None
    if type(count) is not int or count < 1:
        raise ConfigError(f"{key}: {config} has no num_hidden_layers; not a BERT config")
    return count, str(hf.get("model_type", "bert"))


def _known(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys of the section at `loc` (list indexes and mapping names skipped)."""
    for part in (p for p in loc if isinstance(p, str) and p in model.model_fields):
        hint = model.model_fields[part].annotation  # a section, or a list or mapping of them
        model = next(t for t in (hint, *get_args(hint)) if isinstance(t, type) and issubclass(t, BaseModel))
    return list(model.model_fields)


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (YAML keeps the last
    one silently: a value you edited could lose to a forgotten copy further down)."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        for i, key in enumerate(keys):
            if key in keys[:i]:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"key {key!r} given twice",
                    node.value[i][0].start_mark)
        return super().construct_mapping(node, deep)


def merge(base: dict, override: dict) -> dict:
    """`override` over `base`: mappings merge key by key, anything else replaces."""
    both = {k for k, v in override.items() if isinstance(v, dict) and isinstance(base.get(k), dict)}
    return {**base, **override, **{k: merge(base[k], override[k]) for k in both}}


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except FileNotFoundError:
        by = f" (extended by {seen[-1]})" if seen else ""
        raise ConfigError(f"{path}: params file not found{by}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                          "save it as UTF-8") from None
    except yaml.YAMLError as e:  # one line: where and what, not PyYAML's four
        mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None) or e
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    if (base := data.pop("extends", None)) is None:
        return data
    parent = (path.parent / str(base)).resolve()
    if parent in seen or parent == path.resolve():
        raise ConfigError(f"{path}:extends: {base} extends itself, in a cycle")
    extended = _read_yaml(parent, (*seen, path.resolve()))
    _check_tasks_extended(data, extended, path, str(base))
    return merge(extended, data)


def _tasks(data: dict) -> dict:
    """finetune.tasks of a params file's data ({} where it has none, or not as a mapping)."""
    finetune = data.get("finetune")
    tasks = finetune.get("tasks") if isinstance(finetune, dict) else None
    return tasks if isinstance(tasks, dict) else {}


def _check_tasks_extended(data: dict, extended: dict, path: Path, base: str) -> None:
    """A file that extends `base` may change its tasks, or add whole ones (kind and source given),
    not set keys of tasks `base` lacks: merged, such a task would be refused for a key the user
    never wrote (a preset over a params.yaml whose tasks were renamed)."""
    required = TaskConfig.model_fields.keys() - TaskSettings.model_fields.keys()
    theirs = _tasks(extended)
    lacking = [name for name, task in _tasks(data).items()
               if name not in theirs and not (isinstance(task, dict) and required <= task.keys())]
    if lacking:
        raise ConfigError(
            f"{path}:finetune.tasks: names {', '.join(lacking)}, which {base} does not have (its tasks: "
            f"{', '.join(theirs) or 'none'}); the presets bertflow ships were written for its built-in "
            f"tasks: rename each in {path.name} to one of {base}'s tasks, or add it to {base}, or give "
            f"it {' and '.join(sorted(required))} in {path.name}")
