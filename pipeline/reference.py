"""The configuration reference: every params.yaml key with its value in the project's params.yaml
and its description, as Markdown, generated from the schema of components/core/config.py into
docs/configuration.md.

`python -m pipeline.reference` rewrites that page's generated section; a test keeps it current.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from components.core.config import Params
from components.core.params import load_params

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"


def section_in(hint: Any) -> type[BaseModel] | None:
    """The schema class a field holds, itself or as the items of a list or a mapping."""
    for tp in (hint, *typing.get_args(hint)):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp
    return None


def _cell(value: Any) -> str:
    if isinstance(value, BaseModel) or (isinstance(value, list | dict) and _has_model(value)):
        return "see below"
    text = json.dumps(value, default=str)
    return f"`{text}`" if len(text) <= 40 else "see params.yaml"


def _has_model(value: list | dict) -> bool:
    items = value.values() if isinstance(value, dict) else value
    return any(isinstance(v, BaseModel) or isinstance(v, dict) for v in items)


def own_fields(cls: type[BaseModel]) -> dict[str, Any]:
    """A class's fields but those of the section it extends: a task's kind and source (the rest
    are finetune.task_defaults' keys, listed there), a source's name."""
    return {k: f for k, f in cls.model_fields.items() if k not in cls.__base__.model_fields}


def _rows(cls: type[BaseModel], key: str, values: Any, nested: list) -> list[str]:
    rows = []
    for name, f in own_fields(cls).items():
        full = f"{key}.{name}"
        inner = section_in(f.annotation)
        if inner is not None:
            origin = typing.get_origin(f.annotation)
            item = "[]" if origin is list else ".<name>" if origin is dict else ""
            nested.append((inner, full + item, getattr(values, name, None) if not item else None))
        shown = "required" if values is None else _cell(getattr(values, name))
        what = (f.description or "").replace("|", "\\|")
        rows.append(f"| `{full}` | {shown} | {what} |")
    return rows


def reference_markdown() -> str:
    """A table per section of params.yaml (its values), then one per list or mapping entry (the
    keys each entry gives)."""
    params = load_params(ROOT / "params.yaml")
    queue = [(section_in(f.annotation), name, getattr(params, name)) for name,
             f in Params.model_fields.items()]
    out = []
    while queue:
        cls, key, values = queue.pop(0)
        nested: list = []
        column = "params.yaml" if values is not None else "value"
        out += [f"**`{key}`**: {' '.join((cls.__doc__ or '').split())}", "",
                f"| key | {column} | what |", "|---|---|---|", *_rows(cls, key, values, nested), ""]
        queue = nested + queue
    return "\n".join(out).rstrip() + "\n"


def page_with_reference(page: str) -> str:
    """`page` with the text between the reference markers replaced by the reference."""
    head, start, rest = page.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"{PAGE.name} has no {START} ... {END} section")
    return f"{head}{START}\n{reference_markdown()}{END}{tail}"


if __name__ == "__main__":
    PAGE.write_text(page_with_reference(PAGE.read_text()))
    sys.stdout.write(f"{PAGE}: configuration reference rewritten\n")
