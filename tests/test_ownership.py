"""Nothing lost by design: a command replaces only folders every file of which it wrote (the
marker inside lists them, or names the folder itself while bertflow writes it), and no output
path, after links are followed, overlaps the project's code, inputs or stores.

The generic check points every path param and every output argument at each protected place and
asserts one `error:` line with the project's files unchanged; a path param or an output
argument added later is covered by it (or fails the test until it is classified)."""

from __future__ import annotations

import inspect
import json
import shutil
import sys
from pathlib import Path

import pytest

from components.core.config import PathsConfig
from components.core.errors import ConfigError
from components.core.guard import OUTPUT_FOLDERS, OWNED, SOURCE_FOLDERS, WORK, claim, make_work, remove_owned
from components.core.io import atomic_dir
from components.core.params import load_params
from pipeline.cli import app, main
from tests.conftest import run_cli, small_params, tree, write_params

# Where each protected kind of place is, in the project `_project` builds (relative to it).
PROTECTED = {
    "code": "components",
    "inside code": "components/core",
    "checkout": ".",
    "folder holding the checkout": "..",
    "your data": "data/user",
    "inside your data": "data/user/corpus",
    "a folder holding your data": "data",
    "environment": ".venv",
    "MLflow's artifacts": "mlartifacts",
    "DVC remote": ".dvc-storage",
    "DVC's folder": ".dvc",
    "Prefect's home": ".prefect",
    "a link out of the project": "data/ext/raw",
    "a link into your data": "data/ulink/corpus",
    "the corpus source": "data/in/corpus",
    "inside the task source": "data/tasks-in/mine/x",
}


def _project(root: Path, **sections) -> Path:
    """A git checkout with code, your data, stores and two links; returns its params file."""
    for folder in ("components/core", "data/user/corpus", ".venv/bin", "mlartifacts/1", ".dvc-storage/ab",
                   ".prefect", "data/in/corpus", "data/tasks-in/mine"):
        (root / folder).mkdir(parents=True)
    (root / "components/core/io.py").write_text("# code\n")
    (root / "data/user/corpus/mine.txt").write_text("My only copy. Of my corpus.\n")
    (root / "data/in/corpus/doc.txt").write_text("A corpus file. Named by a source.\n")
    (root / "data/tasks-in/mine/train.csv").write_text("text,label\nfine,pos\n")
    for store in (".venv/bin/python", "mlartifacts/1/model.bin", ".dvc-storage/ab/cd"):
        (root / store).write_text("store\n")
    (root.parent / "outside").mkdir()
    (root.parent / "outside" / "keep.txt").write_text("not the project's\n")
    (root / "data" / "ext").symlink_to(root.parent / "outside")
    (root / "data" / "ulink").symlink_to(root / "data" / "user")
    sections.setdefault("ingest", {"sources": [{"name": "mine", "kind": "txt_dir",
                                                "path": "data/in/corpus"}]})
    sections.setdefault("finetune", {"tasks": {"mine": {"kind": "classification",
                                                        "source": "data/tasks-in/mine"}}})
    params = write_params(root, small_params(**sections))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "mine"]):
        run_cli(*cmd, cwd=root)
    (root / ".dvc").mkdir()
    (root / ".dvc" / "config").write_text("[core]\n    remote = local\n['remote \"local\"']\n"
                                          "    url = ../.dvc-storage\n")
    return params


def _everything(root: Path) -> dict:
    return {**tree(root.parent / "outside"), **tree(root)}


def test_every_path_param_is_classified_as_an_output_or_an_input():
    assert set(PathsConfig.model_fields) == {*OUTPUT_FOLDERS, *SOURCE_FOLDERS}


@pytest.mark.parametrize("place", list(PROTECTED))
@pytest.mark.parametrize("key", OUTPUT_FOLDERS)
def test_every_path_param_pointed_at_a_protected_place_is_refused(tmp_path, key, place):
    root = tmp_path / "project"
    root.mkdir()
    params = _project(root, paths={key: PROTECTED[place]})
    before = _everything(root)
    with pytest.raises(ConfigError, match=rf"params.yaml:paths\.{key}: "):
        load_params(params)
    assert _everything(root) == before


# The catalogue, through the command line: each loses nothing and says why in one line.
CATALOGUE = {
    "raw is the code": ({"paths": {"raw": "components"}}, ["stage", "ingest"], "must be a folder inside"),
    "raw is the artifacts": ({"paths": {"raw": "mlartifacts"}}, ["run"], "must be a folder inside"),
    "raw is the DVC remote": ({"paths": {"raw": ".dvc-storage"}}, ["run"], "must be a folder inside"),
    "raw is the environment": ({"paths": {"raw": ".venv"}}, ["run"], "must be a folder inside"),
    "source is raw": ({"paths": {"raw": "data/in/corpus"}}, ["stage", "ingest"], "ingest source 'mine'"),
    "source inside raw": ({"paths": {"raw": "data/in"}}, ["stage", "ingest"], "ingest source 'mine'"),
    "task source in tasks": ({"paths": {"tasks": "data/tasks-in"}}, ["stage", "task_data@mine"],
                             "the source of task 'mine'"),
    "raw through a link out": ({"paths": {"raw": "data/ext/raw"}}, ["stage", "ingest"], "a link to"),
    "raw through a link to your data": ({"paths": {"raw": "data/ulink/corpus"}}, ["stage", "ingest"],
                                        "paths.user_data"),
    "raw is a folder bertflow did not make": ({"paths": {"raw": "data/mine"}}, ["stage", "ingest"],
                                              ("paths.raw: ", "data/mine holds files bertflow")),
    "export into your data": ({}, ["export-hf", "mine", "data/user"], "paths.user_data"),
    "export into the checkout's folder": ({}, ["export-hf", "mine", ".."], "the project folder"),
    "export into a folder of yours": ({}, ["export-hf", "mine", "data/mine"],
                                      ("export-hf OUT: ", "holds files bertflow")),
    "export into the code": ({}, ["export-hf", "mine", "components"], "the project's code"),
    "report onto the code": ({}, ["report", "--out", "components/core/io.py"], "the project's code"),
    "report onto your data": ({}, ["report", "--out", "data/user/corpus/mine.txt"], "paths.user_data"),
    "predictions onto params": ({}, ["predict", "mine", "--text", "a", "--out", "params.yaml"],
                                "the project's code"),
    "predictions into a stage output": ({}, ["predict", "mine", "--text", "a", "--out", "data/raw/p.jsonl"],
                                        "the stage output paths.raw"),
    "embeddings onto the store": ({}, ["embed", "--text", "a", "--out", "mlartifacts/x.parquet"],
                                  "a store or environment (mlartifacts)"),
    "attention onto a folder": ({}, ["attention", "a", "--out", "data/mine"], "is a folder"),
}


@pytest.mark.parametrize("case", list(CATALOGUE))
def test_the_catalogue_of_lost_data_now_refuses_and_loses_nothing(case, tmp_path, monkeypatch, capfd):
    sections, argv, message = CATALOGUE[case]
    _assert_refused(tmp_path, sections, argv, message if isinstance(message, tuple) else (message,),
                    lambda mine: None, monkeypatch, capfd)


def _assert_refused(tmp_path: Path, sections: dict, argv: list[str], messages: tuple[str, ...],
                    setup, monkeypatch, capfd) -> None:
    """`bertflow ARGV` in a project whose data/mine holds a file of the user's (then `setup(mine)`)
    ends in one error line holding each of `messages`, exit 1, every file unchanged."""
    root = tmp_path / "project"
    root.mkdir()
    params = _project(root, **sections)
    mine = root / "data" / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("203 files of mine\n")
    setup(mine)
    before = _everything(root)
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["bertflow", *argv, "-p", str(params)])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capfd.readouterr().err
    assert exited.value.code == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and all(m in err for m in messages), err
    assert _everything(root) == before


def test_every_output_argument_of_every_command_is_in_the_catalogue():
    """A command that gains an output argument must show here that it is checked."""
    def commands(typer_app):
        for info in typer_app.registered_commands:
            yield info.name or info.callback.__name__.replace("_", "-"), info.callback
        for group in typer_app.registered_groups:
            yield from commands(group.typer_instance)

    with_outputs = {name for name, callback in commands(app)
                    if "out" in inspect.signature(callback).parameters}
    covered = {argv[0] for _, argv, _ in CATALOGUE.values()}
    assert with_outputs <= covered, with_outputs - covered


def _written(folder: Path, files: dict[str, str]) -> Path:
    """`folder` written as a stage writes its output (atomic_dir: the manifest inside)."""
    with atomic_dir(folder) as tmp:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
    return folder


def _copied_export(mine: Path) -> None:
    """The user's habit: `cp -r exported/. mine/`, the hidden marker coming along."""
    shutil.copytree(_written(mine.parent / "exported", {"config.json": "{}", "model.safetensors": "w"}),
                    mine, dirs_exist_ok=True)
    shutil.rmtree(mine.parent / "exported")


def _touched_marker(mine: Path) -> None:
    (mine / OWNED).touch()


def _added_to_an_export(mine: Path) -> None:
    precious = (mine / "precious.txt").read_text()
    shutil.rmtree(mine)
    _written(mine, {"config.json": "{}"})
    (mine / "precious.txt").write_text(precious)  # NOTES.txt, added to an earlier export


def _changed_in_an_export(mine: Path) -> None:
    precious = (mine / "precious.txt").read_text()
    shutil.rmtree(mine)
    _written(mine, {"precious.txt": "as bertflow wrote it\n"})
    (mine / "precious.txt").write_text(precious)  # edited by the user since


def _copied_work_marker(mine: Path) -> None:
    """A marker of a folder bertflow was writing, copied in: it names another folder."""
    make_work(mine.parent / "work")
    shutil.copy(mine.parent / "work" / WORK, mine / WORK)
    remove_owned(mine.parent / "work")


def _older_marker(mine: Path) -> None:
    (mine / OWNED).write_text("bertflow made this folder; it replaces or removes a folder only "
                              "while this file is in it.\n")  # what bertflow wrote before manifests


YOURS = {  # how data/mine (holding precious.txt) came to carry a marker, and what the error says
    "a copied export": (_copied_export, "files bertflow did not write (precious.txt)"),
    "a touched marker": (_touched_marker, "lists no files"),
    "a file added to an export": (_added_to_an_export, "files bertflow did not write (precious.txt)"),
    "a file changed in an export": (_changed_in_an_export,
                                    "files changed since bertflow wrote them (precious.txt)"),
    "a copied work marker": (_copied_work_marker, f"no {OWNED} in it"),
    "an older bertflow's marker": (_older_marker, "lists no files"),
}


WRITERS = {  # a stage output (by `bertflow stage` and by `bertflow run`) and an export
    "stage": ({"paths": {"raw": "data/mine"}}, ["stage", "ingest"]),
    "run": ({"paths": {"raw": "data/mine"}}, ["run", "--until", "ingest"]),
    "export-hf": ({}, ["export-hf", "mine", "data/mine"]),
}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("how", list(YOURS))
def test_a_folder_of_yours_carrying_a_marker_is_refused_and_loses_nothing(how, writer, tmp_path, monkeypatch,
                                                                          capfd):
    sections, argv = WRITERS[writer]
    setup, message = YOURS[how]
    _assert_refused(tmp_path, sections, argv, ("data/mine", message), setup, monkeypatch, capfd)


def test_a_folder_is_replaced_or_removed_only_when_every_file_in_it_is_bertflows(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="holds files bertflow did not write"):
        claim(mine, "paths.raw")
    with pytest.raises(ConfigError, match="holds files bertflow did not write"), atomic_dir(mine) as tmp:
        (tmp / "x").write_text("never")
    assert not remove_owned(mine) and (mine / "keep.txt").read_text() == "keep me"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "made")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        make_work(link)
    made = make_work(tmp_path / "made" / "deep")  # a work folder: bertflow writes into it later
    (made / "snapshot").write_text("ours")
    assert remove_owned(made) and not made.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_dir(empty) as tmp:  # an empty folder holds nothing to lose
        (tmp / "x").write_text("ours")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "y").write_text("ours too")
    assert sorted(p.name for p in empty.iterdir()) == [OWNED, "sub", "x"]
    manifest = json.loads((empty / OWNED).read_text())
    assert manifest["folders"] == ["sub"] and sorted(manifest["files"]) == ["sub/y", "x"]
    (empty / "sub" / "y").unlink()  # a listed file gone is no loss
    claim(empty)
    (empty / "sub" / "notes").mkdir()  # ... a folder of the user's inside one of ours is
    with pytest.raises(ConfigError, match=r"did not write \(sub/notes/\)"):
        claim(empty)
    assert not remove_owned(empty) and (empty / "x").read_text() == "ours"


def test_a_copy_of_bertflows_output_with_nothing_added_is_still_its_own(tmp_path):
    # What `dvc checkout` does to an output: the same files, written anew (other inodes and
    # times). The manifest depends on content alone, so the output stays bertflow's, and two
    # equal outputs carry byte-equal markers (DVC's hashes of them stay reproducible).
    first = _written(tmp_path / "first", {"a.parquet": "rows", "sub/b.json": "{}"})
    second = _written(tmp_path / "second", {"sub/b.json": "{}", "a.parquet": "rows"})
    assert (first / OWNED).read_bytes() == (second / OWNED).read_bytes()
    copy = tmp_path / "data" / "raw"
    shutil.copytree(first, copy)
    with atomic_dir(copy) as tmp:
        (tmp / "c").write_text("next run")
    assert sorted(p.name for p in copy.iterdir()) == [OWNED, "c"]


def test_only_temp_folders_bertflow_made_are_cleaned_up_never_a_copy_or_a_look_alike(tmp_path):
    final = tmp_path / "raw"
    backup = tmp_path / ".raw.backup-2024"  # a user's copy, named like a stage's temp folder
    backup.mkdir()
    (backup / "doc.txt").write_text("keep me")
    stale = make_work(tmp_path / ".raw.tmp-killed1")  # what a killed run leaves: a work folder
    (stale / "part-00000.parquet").write_text("half")
    touched = tmp_path / ".raw.tmp-touched"  # a temp-looking folder of the user's, marker touched
    touched.mkdir()
    (touched / WORK).touch()
    (touched / "doc.txt").write_text("keep me too")
    copied = tmp_path / ".raw.tmp-copied"  # a copy of a killed run's temp folder, marker and all
    shutil.copytree(stale, copied)
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("first")
    with atomic_dir(final) as tmp:  # replaces the first output: it is bertflow's
        (tmp / "b").write_text("second")
    assert sorted(p.name for p in final.iterdir()) == [OWNED, "b"]  # marked as ours, no work mark
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".raw.backup-2024", ".raw.tmp-copied", ".raw.tmp-touched", "raw"]
    assert (backup / "doc.txt").read_text() == "keep me"
    assert (touched / "doc.txt").read_text() == "keep me too"
    assert (copied / "part-00000.parquet").read_text() == "half"


def test_an_output_folder_has_the_usual_modes_whatever_the_library_wrote(tiny_encoder):
    # safetensors writes through a temp file of mode 0600: the weights came out private while
    # every other output was readable; atomic_dir gives the whole folder the usual modes.
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    for path in [tiny_encoder, *tiny_encoder.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o777 if path.is_dir() else 0o666) & ~mask, path
