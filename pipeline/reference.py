"""The configuration reference: every params.yaml key with its default and its docstring, as
Markdown, generated from the dataclasses of components/core/config.py into docs/configuration.md.

`python -m pipeline.reference` rewrites that page's generated section; a test keeps it current.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import sys
import typing
from pathlib import Path

import components.core.config as config

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def docstrings() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the field's docstring (the string right after it)."""
    out = {}
    for node in ast.parse(inspect.getsource(config)).body:
        if isinstance(node, ast.ClassDef):
            for stmt, after in zip(node.body, node.body[1:], strict=False):
                if (isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr)
                        and isinstance(after.value, ast.Constant)):
                    out[node.name, stmt.target.id] = " ".join(str(after.value.value).split())
    return out


def _element(hint) -> type | None:
    """The dataclass a list or dict field holds (ingest.sources, finetune.tasks), if any."""
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
    if any(dataclasses.is_dataclass(v) for v in items):
        return "see below"
    text = json.dumps(value, default=str)
    return f"`{text}`" if len(text) <= 40 else "see params.yaml"


def _rows(cls: type, prefix: str, docs: dict, nested: list) -> list[str]:
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            nested.append((hint, key))
        elif (element := _element(hint)) is not None:
            nested.append((element, f"{key}[]" if typing.get_origin(hint) is list else f"{key}.<name>"))
        doc = re.sub(r"\|", r"\\|", docs.get((cls.__name__, f.name), ""))
        rows.append(f"| `{key}` | {_default(f)} | {doc} |")
    return rows


def reference_markdown() -> str:
    """The reference: a table per section of params.yaml, then one per list/dict element."""
    docs = docstrings()
    out = []
    queue: list[tuple[type, str]] = [(hint, f.name) for f, hint in
                                     ((f, typing.get_type_hints(config.Params)[f.name])
                                      for f in dataclasses.fields(config.Params))]
    while queue:
        cls, key = queue.pop(0)
        nested: list[tuple[type, str]] = []
        out += [f"**`{key}`**: {' '.join((cls.__doc__ or '').split())}", "",
                "| key | default | what |", "|---|---|---|", *_rows(cls, key, docs, nested), ""]
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
