"""Starting from an existing BERT checkpoint (pretrain.init_from): the real MiniLM computes what
transformers computes, bad checkpoints are refused naming both sides, continued pretraining
starts where the checkpoint is, and the pipeline (DVC, Prefect) carries the checkpoint through
to the transfer table's arms."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from components.core.errors import DataError
from tests.conftest import PACKAGES, run_cli, section

pytestmark = pytest.mark.usefixtures("prefect_api")  # one Prefect server for the runs

TEXTS = ["The president said the bill would cut taxes.", "A short one.",
         "Café naïve résumé: 1,234 dollars, [MASK] and all."]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = SPECIALS + "the a of to and in is was for on".split() + [f"##{c}" for c in "abcdefghij"]


def _hf_checkpoint(folder: Path, head: str = "BertModel", vocab: list[str] | None = None,
                   vocab_size: int = len(WORDS), seed: int = 0, **config) -> Path:
    """A tiny checkpoint saved by transformers itself (`save_pretrained`), with a vocab.txt."""
    from transformers import BertConfig, BertForPreTraining, BertModel

    hf = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=160, **config)
    torch.manual_seed(seed)
    {"BertModel": BertModel, "BertForPreTraining": BertForPreTraining}[head](hf).save_pretrained(folder)
    if vocab is not None or vocab_size == len(WORDS):
        (folder / "vocab.txt").write_text("".join(w + "\n" for w in (vocab or WORDS)))
    return folder


def _padded(tok, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    encodings = tok.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = torch.tensor([e.ids + [0] * (width - len(e.ids)) for e in encodings])
    return ids, (ids != 0).long()


def test_minilm_in_our_encoder_gives_transformers_hidden_states(tmp_path):
    from tokenizers import Tokenizer
    from transformers import BertModel

    from components.data.tokenizer import load
    from components.model.checkpoint import config_from_hf, import_checkpoint, load_checkpoint
    from components.model.packaged import source_dir

    info = import_checkpoint("all-minilm-l6-v2", tmp_path, PACKAGES, tmp_path / "ckpt")
    assert (info["layers"], info["hidden"], info["heads"], info["vocab_size"]) == (6, 384, 12, 30522)
    assert info["fresh_heads"] == ["mlm", "nsp"]  # BertModel weights: no pretraining heads
    model, fresh = load_checkpoint(tmp_path / "ckpt", config_from_hf(tmp_path / "ckpt" / "config.json"))
    assert fresh == ["mlm", "nsp"]

    source = source_dir("all-minilm-l6-v2", tmp_path, PACKAGES)
    reference = Tokenizer.from_file(str(source / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    ours = load(tmp_path / "ckpt")  # its own padding to 128 dropped, nothing else changed
    assert [e.ids for e in ours.encode_batch(TEXTS)] == [e.ids for e in reference.encode_batch(TEXTS)]

    ids, mask = _padded(ours, TEXTS)
    hf = BertModel.from_pretrained(source).eval()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, 384)
        mine = model.encoder.eval()(ids, None, mask)
    assert (theirs - mine)[mask.bool()].abs().max() <= 1e-4


def test_a_pretraining_checkpoint_brings_its_heads(tmp_path):
    from transformers import BertForPreTraining

    from components.model.checkpoint import config_from_hf, import_checkpoint, load_checkpoint

    source = _hf_checkpoint(tmp_path / "hf", head="BertForPreTraining")
    info = import_checkpoint(str(source), tmp_path, PACKAGES, tmp_path / "ckpt")
    assert info["fresh_heads"] == [] and info["source"] == "hf"
    model, _ = load_checkpoint(tmp_path / "ckpt", config_from_hf(tmp_path / "ckpt" / "config.json"))
    ids = torch.randint(5, len(WORDS), (2, 9), generator=torch.Generator().manual_seed(0))
    types = torch.zeros_like(ids)
    with torch.no_grad():
        ref = BertForPreTraining.from_pretrained(source).eval()(input_ids=ids, token_type_ids=types)
        out = model.eval()(ids, types, torch.ones_like(ids), ids, torch.tensor([0, 1]))
    assert (out["mlm_logits"] - ref.prediction_logits.reshape(-1, len(WORDS))).abs().max() <= 1e-4
    assert (out["nsp_logits"] - ref.seq_relationship_logits).abs().max() <= 1e-4


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _drop_tensor(folder: Path, key: str) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    del state[key]
    save_file(state, folder / "model.safetensors")


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: _edit_config(f, hidden_size=48),
     "embeddings.word_embeddings.weight has shape (25, 32), but {f}/config.json (hidden_size=48, "),
    (lambda f: (f / "vocab.txt").write_text("".join(w + "\n" for w in [*WORDS, "x", "y"])),
     "the tokenizer has 27 tokens but the model's vocabulary (config.json vocab_size) is 25"),
    (lambda f: (f / "vocab.txt").write_text("".join(w + "\n" for w in WORDS if w != "[MASK]") + "b\n"),
     "the tokenizer has no [MASK]"),
    (lambda f: _edit_config(f, hidden_act="relu"), "hidden_act is 'relu'; this pipeline reads hidden_act"),
    (lambda f: _drop_tensor(f, "encoder.layer.1.attention.self.key.weight"),
     "the encoder is incomplete: no bert.encoder.layer.1.attention.self.key.weight"),
    (lambda f: (f / "model.safetensors").write_bytes(b"not a tensor file"), "the file is damaged"),
])
def test_a_bad_checkpoint_is_refused_naming_both_sides(tmp_path, damage, message):
    from components.model.checkpoint import import_checkpoint

    source = _hf_checkpoint(tmp_path / "hf")
    damage(source)
    with pytest.raises(DataError) as error:
        import_checkpoint(str(source), tmp_path, PACKAGES, tmp_path / "ckpt")
    assert message.format(f=source) in str(error.value)
    assert not (tmp_path / "ckpt").exists()  # nothing half-written


def test_init_from_names_a_folder_or_a_packaged_checkpoint(tmp_path):
    from components.model.checkpoint import import_checkpoint

    with pytest.raises(DataError, match="not-there is not a folder, nor a packaged checkpoint "
                                        r"\(all-minilm-l6-v2\)"):
        import_checkpoint("not-there", tmp_path, PACKAGES, tmp_path / "ckpt")
    assert import_checkpoint("", tmp_path, PACKAGES, tmp_path / "ckpt") == {"init_from": ""}


def _corpus_checkpoint(folder: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A tiny BertModel over the small corpus's vocabulary (as if pretrained elsewhere)."""
    from components.data.tokenizer import load

    _hf_checkpoint(folder, vocab_size=load(tokenizer_dir).get_vocab_size(), seed=seed)
    for name in ("tokenizer.json", "vocab.txt"):
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def _continue(stages_dir, pairs_dir, tmp_path, name: str, **settings) -> tuple[dict, dict, dict]:
    from safetensors.torch import load_file

    from components.core.config import ModelConfig, PretrainConfig
    from components.model.checkpoint import import_checkpoint
    from components.training.pretrain import pretrain

    source = _corpus_checkpoint(tmp_path / "hf", stages_dir / "tokenizer")
    ckpt, out = tmp_path / name / "ckpt", tmp_path / name / "encoder"
    import_checkpoint(str(source), tmp_path, PACKAGES, ckpt)
    cfg = section(PretrainConfig, init_from=str(source), batch_size=16, warmup_steps=2, lr=3e-3,
                         short_seq_steps=0, accelerator="cpu", **settings)
    stats = pretrain(model=section(ModelConfig, preset="tiny"), cfg=cfg, pairs_dir=pairs_dir,
                     tokenizer_dir=ckpt,
                     out_dir=out, work_dir=tmp_path / name / "work", checkpoint_dir=ckpt)
    return stats, load_file(ckpt / "model.safetensors"), load_file(out / "model.safetensors")


@pytest.mark.slow
def test_continued_pretraining_starts_at_the_checkpoint_and_warms_up_the_new_heads(
        stages_dir, pairs_out, tmp_path):
    # Head warm-up only: the encoder (and the checkpoint's pooler) must come out exactly as it
    # went in, while the fresh MLM head learned.
    stats, before, after = _continue(stages_dir, pairs_out[0], tmp_path, "warmup", max_steps=8,
                                     head_warmup_steps=8, val_every_steps=8, snapshot_every_steps=8)
    assert stats["fresh_heads"] == ["mlm", "nsp"] and stats["steps"] == 8
    assert stats["history"][0]["step"] == 0 and stats["start_mlm_loss"] == stats["history"][0]["val/mlm_loss"]
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert stats["mlm_loss"] < stats["start_mlm_loss"]  # the head alone already helps

    # Then the whole model trains: the encoder moves, and held-out MLM loss falls further.
    stats, before, after = _continue(stages_dir, pairs_out[0], tmp_path, "full", max_steps=40,
                                     head_warmup_steps=8, val_every_steps=20, snapshot_every_steps=20)
    assert not torch.equal(before["bert.encoder.layer.0.output.dense.weight"],
                           after["bert.encoder.layer.0.output.dense.weight"])
    assert stats["mlm_loss"] < stats["start_mlm_loss"] - 0.5
    info = json.loads((tmp_path / "full" / "encoder" / "bertflow.json").read_text())
    assert (info["config"]["hidden"], info["config"]["layers"]) == (32, 2)  # the checkpoint's shape


@pytest.mark.slow
def test_the_pipeline_continues_a_checkpoint_and_fine_tunes_every_arm(stages_dir, tmp_path):
    # init_from a checkpoint under data/user: the tokenizer stage takes its tokenizer, pretrain
    # continues it, every task trains from all three inits; DVC sees a changed checkpoint.
    from tests.conftest import make_task_project

    repo = make_task_project(tmp_path / "project", {
        "reviews": {"kind": "classification", "source": "data/user/tasks/reviews.csv",
                    "columns": {"text": "review", "label": "verdict"}}})
    _corpus_checkpoint(repo / "data" / "user" / "ckpt", stages_dir / "tokenizer")
    data = yaml.safe_load((repo / "params.yaml").read_text())
    data["pretrain"].update(init_from="data/user/ckpt", head_warmup_steps=10)
    data["finetune"]["init"] = ["pretrained", "checkpoint", "scratch"]
    (repo / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    run_cli("dvc", "add", "data/user/ckpt", cwd=repo)
    run_cli("git", "add", "-A", cwd=repo)
    run_cli("git", "commit", "-qm", "start from a checkpoint", cwd=repo)

    run_cli("bertflow", "run", cwd=repo)
    metrics = repo / "metrics"
    checkpoint = json.loads((metrics / "checkpoint_stats.json").read_text())
    assert checkpoint["source"] == "data/user/ckpt" and checkpoint["fresh_heads"] == ["mlm", "nsp"]
    tokenizer = json.loads((metrics / "tokenizer_stats.json").read_text())
    assert tokenizer["kind"] == "checkpoint" and tokenizer["vocab_size"] == checkpoint["vocab_size"]
    assert (repo / "data" / "tokenizer" / "vocab.txt").read_text() == \
        (repo / "data" / "user" / "ckpt" / "vocab.txt").read_text()
    pretrain = json.loads((metrics / "pretrain_stats.json").read_text())
    assert pretrain["init_from"] == "data/user/ckpt" and pretrain["mlm_loss"] < pretrain["start_mlm_loss"]
    evaluate = json.loads((metrics / "tasks" / "reviews" / "evaluate_stats.json").read_text())
    assert set(evaluate["fits"]) == {"pretrained-s1", "checkpoint-s1", "scratch-s1"}
    table = (metrics / "transfer.md").read_text()
    assert "| pretrained | checkpoint as is | from scratch | gain | vs checkpoint |" in table
    assert "continued pretraining of data/user/ckpt" in table
    assert "| task | pretrained | checkpoint as is | from scratch |" in table  # what each cost
    assert json.loads(run_cli("dvc", "status", "--json", cwd=repo).stdout) == {}

    # A new version of the checkpoint: DVC finds the checkpoint stage stale (and what follows
    # once it has rerun).
    _corpus_checkpoint(repo / "data" / "user" / "ckpt", stages_dir / "tokenizer", seed=1)
    run_cli("dvc", "add", "data/user/ckpt", cwd=repo)
    stale = json.loads(run_cli("dvc", "status", "--json", cwd=repo).stdout)
    assert {"changed deps": {"data/user/ckpt": "modified"}} in stale["checkpoint"]  # its folder alone
