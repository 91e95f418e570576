"""benchmarks/RESULTS.md: each benchmark rewrites its own section and no other, dated and with its
machine."""

from __future__ import annotations

import pytest

from benchmarks.results import read_section, write_section

FILE = "# Benchmark results\n\n## Data path\n\nrows/s 10\n\n## Serving under load\n\nold 1\n"


def _titles(path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("## ")]


def test_a_section_is_replaced_in_place_and_the_others_kept(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(FILE)
    write_section("## Data path\n\nrows/s 20\n", path)
    assert _titles(path) == ["## Data path", "## Serving under load"]
    assert "rows/s 20" in path.read_text() and "rows/s 10" not in path.read_text()
    assert "old 1" in path.read_text()


def test_a_new_section_goes_last_and_copies_of_one_become_one(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(FILE + "\n## Serving under load\n\nold 2\n")
    write_section("## Batch prediction\n\nfast\n", path)
    assert _titles(path) == ["## Data path", "## Serving under load", "## Serving under load",
                             "## Batch prediction"]
    write_section("## Serving under load\n\nnew\n", path)
    assert _titles(path) == ["## Data path", "## Serving under load", "## Batch prediction"]
    assert "old" not in path.read_text() and path.read_text().startswith("# Benchmark results")


def test_text_without_a_title_is_refused(tmp_path):
    with pytest.raises(ValueError, match="title"):
        write_section("rows/s 20\n", tmp_path / "RESULTS.md")


def test_a_section_is_read_back_whole_and_a_missing_one_is_empty(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(FILE)
    assert read_section("## Data path", path).strip() == "## Data path\n\nrows/s 10"
    assert read_section("## Batch prediction", path) == ""
    assert read_section("## Data path", tmp_path / "none.md") == ""


def test_a_section_says_when_and_on_what_it_was_measured():
    import datetime

    from benchmarks.results import measured
    from components.core.machine import cpu_facts

    line = measured()
    assert line.startswith(f"Measured {datetime.date.today().isoformat()} on {cpu_facts()['cpu_model']} (")
    assert " threads, torch " in line and line.endswith(".")
