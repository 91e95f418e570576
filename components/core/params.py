"""Reading params.yaml into the schema (components.core.config): one line per error, naming the
file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from components.core.config import Broken, Params
from components.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false", "string_type":
            "a string", "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping"}


def load_params(path: str | Path) -> Params:
    """Read and check a params file (with `extends: other.yaml`, its differences from that one);
    ConfigError names the file and the key of a bad value."""
    from components.core.guard import check_stage_outputs

    path = Path(path)
    params = parse(Params, _read_yaml(path), f"{path}:")
    check_stage_outputs(params, path.resolve().parent, f"{path}:")
    return params


def parse(model: type[M], data: Any, where: str) -> M:
    """`model` from plain YAML data, every key and type checked; ConfigError names the first bad key."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        error = e.errors()[0]
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
        kind, cause, value = error["type"], error.get("ctx", {}).get("error"), error.get("input")
        got = f"got {type(value).__name__} {value!r}"[:120]
        if isinstance(cause, Broken):  # a cross-field rule, about a key inside the section
            key, what = ".".join(filter(None, (key, cause.args[0]))), cause.args[1]
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
    return merge(_read_yaml(parent, (*seen, path.resolve())), data)
