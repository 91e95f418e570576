"""The documentation: a short README as the door, docs/ for the rest, every link resolving, and
nothing cited that is not in the repository."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_a_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    assert "make test-fast" in readme.split("## Development")[1]
    linked = {m.split("#")[0] for m in LINK.findall(readme)}
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= linked, "a docs page nobody links"


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if path and "://" not in path and not path.startswith("mailto:"):
                if not (page.parent / path).resolve().exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def test_nothing_cites_a_file_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    outside = re.compile(r"\b(DESIGN|DATA|STACK)\.md\b|\.\./shared\b")
    hits = [f"{name}:{i}" for name in tracked if name.endswith((".py", ".md", ".yaml", ".toml", "Makefile"))
            and name != "tests/test_docs.py" and (ROOT / name).exists()
            for i, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
            if outside.search(line)]
    assert not hits, hits


ANSWER_LABEL = re.compile(r'"label": "([^"]+)"')
NAMED_TASK = re.compile(r"(?:bertflow predict|bertflow export-hf|models:/)\s*([\w-]+)")


def _task_labels() -> dict[str, set[str]]:
    """Each built-in task's label set, as the reference run's task_data stage recorded it."""
    import json

    return {p.parent.name: set(json.loads(p.read_text())["labels"])
            for p in (ROOT / "metrics" / "tasks").glob("*/task_data_stats.json")}


def test_example_answers_use_the_tasks_real_labels():
    # An example answer in a code block that names tasks uses one of their labels; elsewhere
    # (the answer table) one of any built-in task's: `pos` where the model says `positive` fails.
    labels = _task_labels()
    assert labels["movie-sentiment"] == {"negative", "positive"}
    anywhere = set().union(*labels.values())
    wrong = []
    for page in _pages():
        for i, part in enumerate(page.read_text().split("```")):
            named = [t for t in NAMED_TASK.findall(part) if t in labels] if i % 2 else []
            allowed = set().union(*(labels[t] for t in named)) if named else anywhere
            wrong += [f"{page.relative_to(ROOT)}: {label!r} (tasks {named or 'any'})"
                      for label in ANSWER_LABEL.findall(part) if label not in allowed]
    assert not wrong, wrong
