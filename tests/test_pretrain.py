"""Pretraining: the batch stream, exact resume after SIGKILL, DDP on CPU, the HF export."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from components.core.config import PretrainConfig
from components.core.guard import OWNED
from components.model.masking import Masker
from components.training.common import linear_schedule
from components.training.pretrain_data import PairBatches, list_row_groups, masking_spec
from tests.conftest import BIN, classic_recipe, run_cli, section, small_params, write_params


@pytest.fixture(scope="module")
def masker(stages_dir):
    return Masker(masking_spec(section(PretrainConfig), stages_dir / "tokenizer"))


def _take(stream, n):
    return list(itertools.islice(iter(stream), n))


def test_ranks_see_disjoint_batches_that_together_are_the_single_stream(pairs_out, masker):
    folder = pairs_out[0] / "train"
    single = _take(PairBatches(folder, 8, masker, 3), 20)
    rank0 = _take(PairBatches(folder, 8, masker, 3, rank=0, world=2), 10)
    rank1 = _take(PairBatches(folder, 8, masker, 3, rank=1, world=2), 10)
    ids = lambda batches: [b["instance_id"].tolist() for b in batches]  # noqa: E731
    assert ids(rank0) == ids(single)[0::2] and ids(rank1) == ids(single)[1::2]
    assert not set(sum(ids(rank0), [])) & set(sum(ids(rank1), []))
    # Same masks too: batch g is masked from (seed, g) whichever rank takes it.
    assert torch.equal(rank1[3]["input_ids"], single[7]["input_ids"])


def test_a_stream_started_at_batch_k_continues_exactly(pairs_out, masker):
    folder = pairs_out[0] / "train"
    rows = sum(b.rows for b in list_row_groups(folder))
    per_epoch = rows // 16
    full = _take(PairBatches(folder, 16, masker, 5), per_epoch + 5)  # crosses an epoch boundary
    k = per_epoch - 3
    resumed = _take(PairBatches(folder, 16, masker, 5, start_batch=k), 8)
    for a, b in zip(full[k:], resumed, strict=True):
        assert torch.equal(a["instance_id"], b["instance_id"]) and torch.equal(a["input_ids"], b["input_ids"])
    # The next epoch visits the data in another order.
    assert not torch.equal(full[0]["instance_id"], full[per_epoch]["instance_id"])


def test_static_masks_stay_with_their_instance(pairs_out, masker):
    folder = pairs_out[0] / "heldout"
    stream = PairBatches(folder, 4, masker, 1, static_masks=True)
    per_epoch = stream.per_epoch
    batches = _take(stream, 2 * per_epoch)

    def masks(part):
        return {int(i): m for b in part for i, m in zip(b["instance_id"], b["input_ids"], strict=True)}

    first, second = masks(batches[:per_epoch]), masks(batches[per_epoch:])
    common = set(first) & set(second)
    assert common and all(torch.equal(first[i], second[i]) for i in common)


def test_warmup_then_linear_decay():
    f = linear_schedule(10, 110)
    assert f(0) == pytest.approx(0.1) and f(9) == 1.0 and f(10) == 1.0
    assert f(60) == pytest.approx(0.5) and f(110) == 0.0


# ---------------------------------------------------------------- the stage, as a process

def _project(root: Path, stages_dir: Path, pairs_dir: Path, recipe: str = "classic", **pretrain) -> Path:
    """A project of the pretrain stage alone: `recipe` classic (params-classic.yaml's, on the NSP
    pairs of `pairs_dir`) or modern (params.yaml's, on streamed documents in `pairs_dir`)."""
    (root / "data").mkdir(parents=True)
    shutil.copytree(stages_dir / "tokenizer", root / "data" / "tokenizer")
    shutil.copytree(pairs_dir, root / "data" / "pairs")
    # Both curriculum phases: 32-token pieces to step 40, full length after it.
    settings = {"max_steps": 120, "warmup_steps": 10, "batch_size": 16, "val_every_steps": 40,
                "snapshot_every_steps": 10, "log_every_steps": 10,
                "short_seq_len": 32, "short_seq_steps": 40, "accelerator": "cpu", **pretrain}
    sections = {"model": {"preset": "tiny"}, "pretrain": settings, "tracking": {"uri": "sqlite:///mlflow.db"}}
    if recipe == "classic":
        sections = classic_recipe(**sections)
    else:  # ModernBERT's recipe; a window of 16 over the tiny shape's two layers, one local, one global
        sections["model"].update(arch="modern", local_window=16)
        sections["pairs"] = {"mode": "stream"}
        settings.update(packed_attention="within", mlm_probability=0.3)
    return write_params(root, small_params(**sections))


def _weights(export: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(export / "model.safetensors")


def _folder_digest(folder: Path) -> dict[str, str]:
    """md5 of every file under `folder`, by relative path: what DVC hashes for an output."""
    import hashlib

    return {str(f.relative_to(folder)): hashlib.md5(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file()}


def _stage_run(project: Path):
    """The pretrain stage's last MLflow run in `project`."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("bertflow").experiment_id
    return client.search_runs([experiment], "tags.`bertflow.stage` = 'pretrain'",
                              order_by=["attributes.start_time DESC"], max_results=1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["classic", "modern"])
def test_killed_run_resumes_on_the_same_trajectory(stages_dir, pairs_out, stream_pairs, tmp_path, recipe):
    """One run straight through (the classic one with another process burning a core all
    along), one killed after its first snapshot and resumed: the same encoder folder, byte for
    byte (weights, bertflow.json), and the same metrics file; for either recipe (NSP pairs in
    padded batches, or streamed documents attending within themselves)."""
    pairs = pairs_out[0] if recipe == "classic" else stream_pairs
    # Snapshots at evaluation steps: a run resumed from one must still evaluate that step.
    straight = _project(tmp_path / "a", stages_dir, pairs, recipe, snapshot_every_steps=40)
    # Load is load whatever the recipe: one burner is enough, on 2 cores it slows the whole suite.
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if recipe == "classic" else None
    try:
        run_cli("bertflow", "stage", "pretrain", "-p", str(straight), cwd=straight.parent)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()

    killed = _project(tmp_path / "b", stages_dir, pairs, recipe, snapshot_every_steps=40)
    ckpts = killed.parent / "data" / "models" / "pretrain-snapshots"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(["bertflow", "stage", "pretrain", "-p", str(killed)], cwd=killed.parent,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while not list(ckpts.glob("*/last.ckpt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list(ckpts.glob("*/last.ckpt")), "no checkpoint was written before the kill"
    assert not (killed.parent / "data" / "models" / "encoder").exists()  # nothing half-exported

    run_cli("bertflow", "stage", "pretrain", "-p", str(killed), cwd=killed.parent)
    assert _stage_run(killed.parent).data.metrics["this_run.resumed"] == 1
    assert _stage_run(straight.parent).data.metrics["this_run.resumed"] == 0
    stats = json.loads((killed.parent / "metrics" / "pretrain_stats.json").read_text())
    assert stats["steps"] == 120 and stats["stopped_by"] == "max_steps"
    assert _folder_digest(straight.parent / "data" / "models" / "encoder") == \
        _folder_digest(killed.parent / "data" / "models" / "encoder")
    assert (straight.parent / "metrics" / "pretrain_stats.json").read_bytes() == \
        (killed.parent / "metrics" / "pretrain_stats.json").read_bytes()
    assert not list(ckpts.glob("*/last.ckpt"))  # finished: checkpoints are cleaned up
    if recipe == "classic":  # the modern export's check: tests/test_modern.py
        _check_export(straight.parent)


@pytest.mark.slow
def test_a_run_the_time_budget_stops_is_evaluated_once_at_its_end(stages_dir, pairs_out, tmp_path):
    params = _project(tmp_path, stages_dir, pairs_out[0], max_steps=100_000, val_every_steps=50_000,
                      snapshot_every_steps=50_000, max_minutes=0.05)
    run_cli("bertflow", "stage", "pretrain", "-p", str(params), cwd=tmp_path)
    stats = json.loads((tmp_path / "metrics" / "pretrain_stats.json").read_text())
    steps = [int(line.split(",")[0]) for line in
             (tmp_path / "metrics" / "pretrain_curve.csv").read_text().splitlines()[1:]]
    assert 0 < stats["steps"] < 100_000  # stopped by the guard
    assert steps == [stats["steps"]]  # the end, evaluated once
    # ... and marked as cut short: in the stats, the encoder's record and an MLflow tag.
    assert stats["stopped_by"] == "max_minutes" and stats["max_steps"] == 100_000
    encoder = json.loads((tmp_path / "data" / "models" / "encoder" / "bertflow.json").read_text())
    assert encoder["stats"]["stopped_by"] == "max_minutes"
    assert _stage_run(tmp_path).data.tags["bertflow.guard_fired"] == \
        f"pretrain.max_minutes at step {stats['steps']} of 100000"


def _check_export(project: Path) -> None:
    from transformers import BertForPreTraining

    from components.model.build import build_model
    from components.model.config import BertConfig
    from components.model.hf_layout import load_bert_state_dict

    export = project / "data" / "models" / "encoder"
    assert {p.suffix for p in export.iterdir() if p.name != OWNED} <= {".safetensors", ".json", ".txt"}
    hf, info = BertForPreTraining.from_pretrained(export, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = build_model(BertConfig(**json.loads((export / "bertflow.json").read_text())["config"]))
    load_bert_state_dict(ours, _weights(export))
    ours.eval()
    hf.eval()
    ids = torch.randint(5, ours.cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    types = torch.zeros_like(ids)
    with torch.no_grad():
        out = ours(ids, types, torch.ones_like(ids, dtype=torch.bool), ids, torch.tensor([0, 1]))
        ref = hf(input_ids=ids, token_type_ids=types)
    assert (out["mlm_logits"] - ref.prediction_logits.reshape(-1, ours.cfg.vocab_size)).abs().max() <= 1e-4
    assert (out["nsp_logits"] - ref.seq_relationship_logits).abs().max() <= 1e-4
    # The curve, as CSV for DVC plots and PNG for people.
    assert (project / "metrics" / "pretrain_curve.csv").read_text().startswith("step,tokens,mlm_accuracy")
    assert (project / "metrics" / "pretrain_curve.png").stat().st_size > 1000


@pytest.mark.slow
def test_ddp_with_two_processes_on_cpu(stages_dir, pairs_out, tmp_path):
    from mlflow.tracking import MlflowClient

    params = _project(tmp_path / "ddp", stages_dir, pairs_out[0], devices="2", strategy="ddp",
                      max_steps=20, val_every_steps=10, short_seq_steps=10)
    run_cli("bertflow", "stage", "pretrain", "-p", str(params), cwd=params.parent)
    stats = json.loads((params.parent / "metrics" / "pretrain_stats.json").read_text())
    assert stats["world_size"] == 2 and stats["steps"] == 20
    assert stats["ddp_first_batch_overlap"] == 0  # the two ranks trained on different instances
    assert stats["mlm_accuracy"] is not None
    client = MlflowClient(f"sqlite:///{params.parent / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
    assert [r.info.run_name for r in runs] == ["pretrain"]  # one run, from rank 0 only
    assert "train/loss" in runs[0].data.metrics and "val/mlm_accuracy" in runs[0].data.metrics
    assert (params.parent / "data" / "models" / "encoder" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_terminated_stage_is_a_failed_run_and_leaves_no_process_or_output(stages_dir, pairs_out, tmp_path):
    import sqlite3

    import psutil

    from pipeline.ops.lock import project_lock

    params = _project(tmp_path, stages_dir, pairs_out[0], max_steps=100_000, val_every_steps=50_000,
                      snapshot_every_steps=50_000)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(["bertflow", "stage", "pretrain", "-p", str(params)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, db = time.time() + 300, tmp_path / "mlflow.db"

    def training() -> bool:  # the first losses are in the stage's MLflow run
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                return bool(con.execute("select 1 from metrics where key = 'train/loss'").fetchone())
        except sqlite3.Error:
            return False

    while not training():
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    started = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)  # what `kill PID` and service managers send
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    assert _stage_run(tmp_path).info.status == "FAILED"  # not RUNNING for ever
    assert not (tmp_path / "data" / "models" / "encoder").exists()
    _, alive = psutil.wait_procs(started, timeout=15)
    assert not alive
    with project_lock(tmp_path):  # free
        pass


@pytest.mark.slow
def test_electra_trains_both_losses_and_its_discriminator_loads_in_transformers(stages_dir, pairs_out,
                                                                                 tmp_path):
    from mlflow.tracking import MlflowClient
    from transformers import BertModel, ElectraConfig, ElectraForPreTraining

    from components.model.build import build_model
    from components.model.config import BertConfig
    from components.model.hf_layout import load_bert_state_dict

    params = _project(tmp_path / "electra", stages_dir, pairs_out[0], objective="electra", max_steps=60,
                      val_every_steps=30, short_seq_steps=20)
    run_cli("bertflow", "stage", "pretrain", "-p", str(params), cwd=params.parent)
    stats = json.loads((params.parent / "metrics" / "pretrain_stats.json").read_text())
    assert stats["objective"] == "electra" and stats["steps"] == 60
    # The generator replaces some of the masked tokens (not all: some samples are the original)
    # and the discriminator judges every token.
    replaced = stats["replaced_fraction"]
    assert 0 < replaced < 0.15 and stats["rtd_accuracy"] > 1 - replaced - 0.05
    assert 0 < stats["generator_parameters"] < stats["parameters"]
    client = MlflowClient(f"sqlite:///{params.parent / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])[0]
    logged = set(run.data.metrics)
    assert {"train/mlm_loss", "train/rtd_loss", "val/rtd_accuracy", "val/mlm_accuracy"} <= logged

    # The export is the discriminator: a BertModel to transformers (no missing keys, the same
    # hidden states), its RTD head ElectraForPreTraining's (the same logits).
    export = params.parent / "data" / "models" / "encoder"
    weights = _weights(export)
    assert not any(k.startswith("cls.predictions") for k in weights)  # no MLM head, no generator
    hf, info = BertModel.from_pretrained(export, output_loading_info=True)
    assert not info["missing_keys"]
    cfg = BertConfig(**json.loads((export / "bertflow.json").read_text())["config"])
    assert cfg.rtd
    ours = build_model(cfg)
    load_bert_state_dict(ours, weights)
    ours.eval()
    ids = torch.randint(5, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    types, mask = torch.zeros_like(ids), torch.ones_like(ids)
    with torch.no_grad():
        hidden = ours.encoder(ids, types, mask)
        assert (hidden - hf.eval()(input_ids=ids, token_type_ids=types).last_hidden_state).abs().max() <= 1e-4
        electra = ElectraForPreTraining(ElectraConfig(
            vocab_size=cfg.vocab_size, embedding_size=cfg.hidden, hidden_size=cfg.hidden,
            num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, intermediate_size=cfg.intermediate,
            max_position_embeddings=cfg.max_position, layer_norm_eps=cfg.layer_norm_eps)).eval()
        renamed = {k.replace("bert.", "electra.", 1): v for k, v in weights.items()}
        missing, _ = electra.load_state_dict(renamed, strict=False)
        assert not missing
        theirs = electra(input_ids=ids, token_type_ids=types).logits  # (B, T)
        assert (ours.rtd(hidden) - theirs).abs().max() <= 1e-4
