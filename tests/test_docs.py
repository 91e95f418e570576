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
    assert len(readme.splitlines()) <= 250
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
