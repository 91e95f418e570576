"""The bad-input catalogue, the cases not covered beside their stage's other tests (the README's
"What happens when…" lists them all): each either fails with a message naming the file, key or
row and leaves nothing half-written, or goes on with what it dropped counted in the stats."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.core.config import (
    CleanConfig,
    ExecutorConfig,
    FinetuneConfig,
    IngestConfig,
    ModelConfig,
    PairsConfig,
    PretrainConfig,
    TokenizerConfig,
)
from components.core.errors import DataError
from components.data.clean import clean
from components.data.ingest import ingest
from components.data.pairs import make_pairs
from components.data.tokenizer import train_tokenizer
from tests.conftest import PACKAGES, section, source_config, task_config

SERIAL = section(ExecutorConfig, kind="serial")
TOPICS = ["budget", "river", "garden", "market", "school", "harbour", "museum", "railway"]


def prose(topic: str, sentences: int = 6) -> str:
    """A document of `sentences` distinct sentences about `topic`."""
    return " ".join(f"The {topic} committee met on day {i} and talked about the {topic} plan "
                    f"number {i * 7}." for i in range(sentences))


def corpus(root: Path, docs: dict[str, str | bytes]) -> IngestConfig:
    """A txt_dir source holding `docs` (file name -> text), under `root`."""
    folder = root / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return section(IngestConfig, sources=[source_config("mine", kind="txt_dir", path=str(folder))])


def ingest_and_clean(root: Path, docs: dict[str, str | bytes]) -> dict:
    ingest(corpus(root, docs), root, PACKAGES, root / "raw")
    return clean(section(CleanConfig), SERIAL, root / "raw", root / "clean")


def no_output_left(folder: Path) -> bool:
    """Neither the output nor a temp folder of it exists."""
    return not folder.exists() and not list(folder.parent.glob(f".{folder.name}.*"))


# ----------------------------------------------------------------------- corpus: dropped, counted

@pytest.mark.slow
def test_a_50_mb_single_line_is_dropped_as_too_long_and_the_rest_goes_on(tmp_path):
    line = ("lorem ipsum dolor sit amet " * 1_900_000)[:50_000_000]  # no line break, no full stop
    stats = ingest_and_clean(tmp_path, {"dump.txt": line, **{f"{t}.txt": prose(t) for t in TOPICS}})
    assert stats["sentences_dropped"]["too_long"] >= 1
    assert stats["documents_dropped"]["few_sentences"] == 1
    assert stats["documents_out"] == len(TOPICS)


def test_a_document_of_one_sentence_is_dropped_and_counted(tmp_path):
    docs = {"short.txt": "Only one sentence lives in this little file.",
            **{f"{t}.txt": prose(t) for t in TOPICS}}
    stats = ingest_and_clean(tmp_path, docs)
    assert stats["documents_dropped"] == {"few_sentences": 1}
    assert stats["documents_out"] == len(TOPICS)


def test_an_all_duplicate_corpus_fails_saying_what_was_dropped(tmp_path):
    with pytest.raises(DataError) as info:
        ingest_and_clean(tmp_path, {f"copy{i}.txt": prose("budget") for i in range(12)})
    message = str(info.value)
    assert str(tmp_path / "raw") in message and "documents_dropped.exact_duplicate: 11" in message
    assert no_output_left(tmp_path / "clean")


def test_fifos_odd_file_names_and_an_empty_source_are_counted_never_waited_on(tmp_path):
    cfg = corpus(tmp_path, {f"{t}.txt": prose(t) for t in TOPICS[:2]})
    os.mkfifo(tmp_path / "corpus" / "pipe.txt")  # reading it would wait for a writer forever
    name = os.fsdecode(b"caf\xe9.txt")  # a Latin-1 file name: not UTF-8
    (tmp_path / "corpus" / name).write_text(prose("cafe"))
    (tmp_path / "empty").mkdir()
    cfg.sources.append(source_config("nothing", kind="txt_dir", path=str(tmp_path / "empty")))
    stats = ingest(cfg, tmp_path, PACKAGES, tmp_path / "raw")
    assert stats["dropped"] == {"not_a_regular_file": 1, "source_without_documents": 1}
    assert "mine:pipe.txt (a FIFO): not_a_regular_file" in stats["problems"]
    assert "nothing: source_without_documents" in stats["problems"]
    assert stats["documents_per_source"] == {"mine": 3}
    import pyarrow.parquet as pq

    ids = pq.read_table(tmp_path / "raw" / "part-00000.parquet").column("doc_id").to_pylist()
    assert "mine:caf\\xe9.txt" in ids  # the odd byte shown, not a crash writing Parquet


# ----------------------------------------------------------------------------- tokenizer, pretrain

@pytest.fixture(scope="module")
def tiny_stages(tmp_path_factory) -> Path:
    """ingest, clean, tokenizer and pairs of an eight-document corpus."""
    root = tmp_path_factory.mktemp("tiny")
    ingest_and_clean(root, {f"{t}.txt": prose(t, 12) for t in TOPICS})
    train_tokenizer(section(TokenizerConfig, vocab_size=120), root / "clean", root / "tokenizer")
    make_pairs(section(PairsConfig, max_seq_len=32), SERIAL, root / "clean", root / "tokenizer",
               root / "pairs")
    return root


def test_a_vocab_larger_than_the_corpus_supports_is_trimmed_with_a_warning(tiny_stages, tmp_path):
    stats = train_tokenizer(section(TokenizerConfig, vocab_size=30_000), tiny_stages / "clean",
                            tmp_path / "tok")
    assert stats["vocab_size"] < 30_000 and stats["vocab_size_requested"] == 30_000
    assert "fewer than tokenizer.vocab_size=30000" in stats["warning"]
    assert (tmp_path / "tok" / "tokenizer.json").exists()


TINY_PRETRAIN = {"max_steps": 4, "warmup_steps": 1, "batch_size": 4, "val_every_steps": 2,
                 "snapshot_every_steps": 2, "short_seq_steps": 0, "accelerator": "cpu"}


def _pretrain(stages: Path, out: Path, **cfg):
    from components.training.pretrain import pretrain

    return pretrain(model=section(ModelConfig, preset="tiny"), cfg=section(PretrainConfig,
                                                                           **{**TINY_PRETRAIN, **cfg}),
                    pairs_dir=stages / "pairs", tokenizer_dir=stages / "tokenizer", out_dir=out / "encoder",
                    work_dir=out / "snapshots")


def test_a_corpus_smaller_than_one_batch_fails_before_training(tiny_stages, tmp_path):
    with pytest.raises(DataError, match=r"pairs/train are fewer than one batch of 4096"):
        _pretrain(tiny_stages, tmp_path, batch_size=4096)
    assert no_output_left(tmp_path / "encoder")


def _snapshot_path(stages: Path, out: Path) -> Path:
    """Where `_pretrain` looks for the snapshot to resume from."""
    from components.data.tokenizer import load
    from components.model.metadata import CheckpointInfo
    from components.training.pretrain import bert_config, run_fingerprint

    cfg = section(PretrainConfig, **TINY_PRETRAIN)
    bert = bert_config(section(ModelConfig, preset="tiny"), load(stages / "tokenizer").get_vocab_size(), cfg)
    run = run_fingerprint(bert, cfg, stages / "pairs", stages / "tokenizer", CheckpointInfo(init_from=""))
    from components.core.guard import make_work

    return make_work(out / "snapshots" / run) / "last.ckpt"  # as pretraining makes it


class _RunsCode:
    """What a malicious snapshot would carry: unpickling it calls `Path.touch`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_snapshot_holding_pickled_code_is_refused_by_name_and_never_run(tiny_stages, tmp_path):
    import torch

    path = _snapshot_path(tiny_stages, tmp_path)
    marker = tmp_path / "code-ran"
    torch.save({"state_dict": {}, "bertflow": {}, "callbacks": _RunsCode(marker)}, path)
    with pytest.raises(DataError) as info:
        _pretrain(tiny_stages, tmp_path)
    assert str(path) in str(info.value) and "holds pickled objects" in str(info.value)
    assert not marker.exists()  # the snapshot's code never ran
    assert no_output_left(tmp_path / "encoder")


def test_a_damaged_snapshot_is_set_aside_and_pretraining_starts_over(tiny_stages, tmp_path, caplog):
    path = _snapshot_path(tiny_stages, tmp_path)
    path.write_bytes(b"PK\x03\x04 half a zip file")  # what a disk failure could leave
    stats = _pretrain(tiny_stages, tmp_path)
    assert stats["this_run"]["resumed"] == 0 and stats["steps"] == TINY_PRETRAIN["max_steps"]
    assert (tmp_path / "encoder" / "model.safetensors").is_file()
    assert f"the snapshot {path} is damaged" in caplog.text
    assert not path.parent.exists()  # the run's snapshots, the damaged one too, go with the export


# ----------------------------------------------------------------------------- a full disk

@contextlib.contextmanager
def tmpfs(folder: Path, kb: int) -> Iterator[Path]:
    """A tmpfs of `kb` kB mounted on `folder` (made if missing), unmounted at the end; the test is
    skipped where mounting is not permitted (it needs root, or CAP_SYS_ADMIN)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs", str(folder)],
                                 capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def free_space(folder: Path, kb: int) -> None:
    """The tmpfs on `folder` grown to `kb` kB, its files kept: the space a user frees."""
    subprocess.run(["mount", "-o", f"remount,size={kb}k", str(folder)], check=True)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The `error:` line a failed command ended with, after checking it failed cleanly."""
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), proc.stderr[-3000:]
    return last


def test_a_snapshot_that_cannot_be_written_leaves_the_last_good_one_and_names_the_folder(tmp_path):
    import torch

    from components.training.snapshot_io import AtomicCheckpointIO

    with tmpfs(tmp_path / "tiny", 64) as tiny:
        io = AtomicCheckpointIO()
        io.save_checkpoint({"w": torch.zeros(4_000)}, tiny / "last.ckpt")  # 16 kB: fits
        good = (tiny / "last.ckpt").read_bytes()
        with pytest.raises(OSError) as info:  # 48 kB beside the 16 kB one: the disk fills
            io.save_checkpoint({"w": torch.ones(12_000)}, tiny / "last.ckpt")
        assert info.value.filename == str(tiny) and "No space left on device" in str(info.value)
        assert (tiny / "last.ckpt").read_bytes() == good and os.listdir(tiny) == ["last.ckpt"]
        assert torch.load(tiny / "last.ckpt")["w"].shape == (4_000,)


def _pretrain_project(stages: Path, root: Path, **pretrain) -> Path:
    """A project holding the tokenizer and pairs of `stages`, set to pretrain TINY_PRETRAIN."""
    import shutil

    from tests.conftest import small_params, write_params

    write_params(root, small_params(tracking={"uri": "sqlite:///mlflow.db"}, model={"preset": "tiny"},
                                    pretrain={**TINY_PRETRAIN, **pretrain}))
    for stage in ("tokenizer", "pairs"):  # what pretraining reads, as those stages wrote it
        shutil.copytree(stages / stage, root / "data" / stage)
    return root


# One snapshot of TINY_PRETRAIN's model is 1.8 MB: it fits, and the next one, written beside it
# before it is replaced (3.6 MB together), does not; anything from 1.35 to 2.7 MB a snapshot would do.
SNAPSHOT_ROOM_KB = 2_700


@pytest.mark.slow  # a real pretraining on a tmpfs: 15 s, beyond the fast loop's budget
def test_a_full_disk_in_pretraining_keeps_the_last_snapshot_and_a_rerun_goes_on(tiny_stages, tmp_path):
    import torch

    from tests.conftest import run_cli

    project = _pretrain_project(tiny_stages, tmp_path / "project", max_steps=6)
    with tmpfs(project / "data" / "models" / "pretrain-snapshots", SNAPSHOT_ROOM_KB) as snapshots:
        failed = run_cli("bertflow", "stage", "pretrain", cwd=project, check=False)
        (run,) = [p for p in snapshots.iterdir() if p.is_dir()]  # this run's snapshots
        assert one_error_line(failed) == ("error: No space left on device while writing a pretraining "
                                          f"snapshot into: {run}")
        # The snapshot of step 2 whole, none half-written beside it, no encoder exported.
        assert not [p.name for p in run.iterdir() if p.name.startswith(".last.ckpt")]
        assert torch.load(run / "last.ckpt", weights_only=True)["global_step"] == 2
        assert no_output_left(project / "data" / "models" / "encoder")
        free_space(snapshots, 16_384)
        rerun = run_cli("bertflow", "stage", "pretrain", cwd=project)
        assert f"pretrain: resuming from {run / 'last.ckpt'} (step 2)" in rerun.stderr
        assert (project / "data" / "models" / "encoder" / "model.safetensors").is_file()
        assert not run.exists()  # the export done, its snapshots go


def test_a_full_disk_at_the_encoder_export_names_it_and_a_rerun_writes_it(tiny_stages, tmp_path):
    from tests.conftest import run_cli

    project = _pretrain_project(tiny_stages, tmp_path / "project", max_steps=2)
    # The snapshots on a disk of their own, with room: only the export fills data/models.
    with tmpfs(project / "data" / "models", 64) as models, \
            tmpfs(models / "pretrain-snapshots", 16_384):
        failed = run_cli("bertflow", "stage", "pretrain", cwd=project, check=False)
        assert no_output_left(models / "encoder")
        line = one_error_line(failed)
        assert line.startswith("error: No space left on device") and str(models) in line, line
        free_space(models, 16_384)
        run_cli("bertflow", "stage", "pretrain", cwd=project)
        assert (models / "encoder" / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def registry_project(tmp_path_factory) -> Path:
    """A project whose registry holds a tiny classification model `reviews`, its champion."""
    from components.core import tracking
    from components.core.params import load_params
    from components.lifecycle import registry
    from tests.conftest import small_params, write_params
    from tests.test_serving import tiny_task_model

    root = tmp_path_factory.mktemp("registry")
    p = load_params(write_params(root, small_params(tracking={"uri": "sqlite:///mlflow.db"})))
    model = tiny_task_model(root / "model")
    with tracking.mlflow_run(p.tracking, root, "registry") as run:
        registry.register_task(tracking.client(p.tracking, root), run, "reviews", "classification", model,
                               [{"text": "a great film"}], "accuracy", 0.5, {})
    return root


def test_a_full_disk_in_export_hf_leaves_no_half_export_and_a_rerun_writes_it(registry_project,
                                                                                        tmp_path):
    from tests.conftest import run_cli

    with tmpfs(tmp_path / "disk", 4) as disk:
        out = disk / "hf"
        failed = run_cli("bertflow", "export-hf", "reviews", str(out), cwd=registry_project, check=False)
        assert os.listdir(disk) == []  # no half-written export, no temp folder beside it
        line = one_error_line(failed)
        assert line.startswith("error: No space left on device") and str(disk) in line, line
        free_space(disk, 4_096)
        run_cli("bertflow", "export-hf", "reviews", str(out), cwd=registry_project)
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))


# ------------------------------------------------------------------------------- fine-tuning

@pytest.fixture(scope="module")
def encoder(tiny_stages, tmp_path_factory) -> Path:
    from components.data.tokenizer import load
    from components.model.build import build_model
    from components.model.folders import write_encoder
    from components.model.metadata import EncoderInfo
    from tests.conftest import encoder_config

    cfg = encoder_config(load(tiny_stages / "tokenizer").get_vocab_size(), hidden=32,
                         layers=1, heads=2, intermediate=64, max_position=64)
    out = tmp_path_factory.mktemp("encoder") / "encoder"
    write_encoder(build_model(cfg), EncoderInfo(cfg), tiny_stages / "tokenizer", out)
    return out


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    from components.data.tasks.prepare import prepare_task
    from tests.test_finetune import _user_files

    root = tmp_path_factory.mktemp("task")
    _user_files(root / "user")
    task = task_config("classification", "user/reviews.csv", columns={"text": "review", "label": "verdict"})
    prepare_task("reviews", task, root, PACKAGES, root / "reviews")
    return root / "reviews"


def _finetune(task_dir: Path, encoder_dir: Path, out: Path) -> dict:
    from components.training.finetune import finetune_start

    task = task_config("classification", "unused", lr=5e-4, epochs=1)
    cfg = section(FinetuneConfig, seeds=[1], init=["pretrained"], workers=1)
    return finetune_start("reviews", task, cfg, init="pretrained", task_dir=task_dir, encoder_dir=encoder_dir,
                          out_dir=out / "model")


def _copy(encoder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(encoder, to)
    return to


def test_finetuning_without_an_encoder_says_to_pretrain_first(task_dir, tmp_path):
    with pytest.raises(DataError, match=r"no pretrained encoder; run the pretrain stage first"):
        _finetune(task_dir, tmp_path / "nowhere", tmp_path)
    assert no_output_left(tmp_path / "model")


def test_a_tokenizer_that_does_not_match_the_encoder_is_refused(task_dir, encoder, tiny_stages, tmp_path):
    other = _copy(encoder, tmp_path / "encoder")
    train_tokenizer(section(TokenizerConfig, vocab_size=80), tiny_stages / "clean", tmp_path / "tok80")
    (other / "tokenizer.json").write_bytes((tmp_path / "tok80" / "tokenizer.json").read_bytes())
    with pytest.raises(DataError, match=r"encoder: the tokenizer does not match the model: \d+ tokens"):
        _finetune(task_dir, other, tmp_path)
    assert no_output_left(tmp_path / "model")


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_damaged_or_missing_encoder_weights_are_named(task_dir, encoder, tmp_path, damage):
    broken = _copy(encoder, tmp_path / "encoder")
    weights = broken / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        weights.unlink()
    expected = "the file is damaged" if damage == "truncated" else "missing; the model folder is incomplete"
    with pytest.raises(DataError, match=f"{weights}: .*{expected}"):
        _finetune(task_dir, broken, tmp_path)
    assert no_output_left(tmp_path / "model")


def test_a_task_model_with_damaged_weights_is_named_when_loaded(task_dir, encoder, tmp_path):
    from components.lifecycle.inference import load_task_model

    _finetune(task_dir, encoder, tmp_path)
    model = tmp_path / "model" / "model"  # the exported fit, as the registry and predict load it
    assert load_task_model(model).kind == "classification"
    (model / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(DataError, match=f"{model / 'model.safetensors'}: not readable as safetensors"):
        load_task_model(model)
