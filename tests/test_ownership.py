"""A stage never deletes what it does not own: output paths are checked before anything is
written, and a stage cleans up only the temp folders it marked as its own."""

from __future__ import annotations

import pytest

from components.core.io import TEMP_MARK, atomic_dir
from tests.conftest import run_cli, small_params, tree, write_params


@pytest.mark.parametrize(("paths", "message"), [
    ({"raw": ""}, "paths.raw: '' must be a folder inside the project"),  # was: the checkout went
    ({"raw": "data/user"}, "paths.raw: 'data/user' overlaps paths.user_data ('data/user')"),
    ({"models": "."}, "paths.models: '.' must be a folder inside the project"),
    ({"tasks": "data/raw/tasks"}, "paths.tasks: 'data/raw/tasks' overlaps paths.raw ('data/raw')"),
])
def test_a_stage_told_to_replace_the_checkout_or_your_data_refuses_and_deletes_nothing(
        tmp_path, paths, message):
    project = tmp_path / "project"
    (project / "data" / "user" / "corpus").mkdir(parents=True)
    (project / "data" / "user" / "corpus" / "mine.txt").write_text("My only copy. Of my corpus.\n")
    params = write_params(project, small_params(paths=paths))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "mine"]):
        run_cli(*cmd, cwd=project)
    before = tree(project)
    proc = run_cli("bertflow", "stage", "ingest", "-p", str(params), cwd=project, check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {params}:{message}"), lines
    assert tree(project) == before


def test_only_marked_temp_folders_are_cleaned_up_never_a_user_folder_of_a_similar_name(tmp_path):
    final = tmp_path / "raw"
    backup = tmp_path / ".raw.backup-2024"  # a user's copy, named like a stage's temp folder
    backup.mkdir()
    (backup / "doc.txt").write_text("keep me")
    stale = tmp_path / ".raw.tmp-killed1"  # what a killed run leaves: a temp folder, marked
    stale.mkdir()
    (stale / TEMP_MARK).touch()
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("first")
    with atomic_dir(final) as tmp:  # replaces the first output
        (tmp / "b").write_text("second")
    assert sorted(p.name for p in final.iterdir()) == ["b"]  # no marker in an output
    assert sorted(p.name for p in tmp_path.iterdir()) == [".raw.backup-2024", "raw"]
    assert (backup / "doc.txt").read_text() == "keep me"
