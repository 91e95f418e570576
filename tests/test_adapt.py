"""Task-adaptive pretraining (stage adapt@task): the task's own text, packed, continues the encoder."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from components.core.config import AdaptConfig, FinetuneConfig, ModelConfig, PretrainConfig
from components.core.errors import DataError
from components.data.tasks.folder import read_split
from components.data.tasks.prepare import prepare_task
from components.data.tokenizer import load
from components.model.folders import read_weights
from components.model.metadata import read_encoder_info, read_task_model_info
from components.training.adapt import START, adapt_task, write_task_pairs
from components.training.finetune import finetune_start
from tests.conftest import section, task_config
from tests.test_finetune import _user_files

REVIEWS = task_config("classification", "user/reviews.csv", columns={"text": "review", "label": "verdict"},
                      lr=3e-3, epochs=1)
SMALL = section(AdaptConfig, steps=4, lr=1e-3, batch_size=8, max_seq_len=32)
PRETRAIN = section(PretrainConfig, accelerator="cpu", val_every_steps=2)


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapt")
    _user_files(root / "user")
    prepare_task("reviews", REVIEWS, root, root / "packages", root / "tasks" / "reviews")
    return root / "tasks" / "reviews"


def test_the_train_and_validation_text_is_packed_in_order_without_labels_or_test(reviews, tiny_encoder,
                                                                                   tmp_path):
    counts = write_task_pairs(reviews, "classification", tiny_encoder, 32, 8, tmp_path / "pairs")
    tok = load(tiny_encoder)
    special = {tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")}
    for split, folder in (("train", "train"), ("valid", "heldout")):
        table = pq.read_table(tmp_path / "pairs" / folder / "part-00000.parquet")
        assert counts[folder]["sequences"] == table.num_rows
        assert set(table["next_sentence_label"].to_pylist()) == {-1}  # no pair objective
        packed = [t for row in table["input_ids"].to_pylist() for t in row if t not in special]
        texts = read_split(reviews, split)["text"].to_pylist()
        assert packed == [t for e in tok.encode_batch(texts, add_special_tokens=False) for t in e.ids]
        assert all(len(row) <= 32 for row in table["input_ids"].to_pylist())
    too_many = counts["heldout"]["sequences"] + 1
    with pytest.raises(DataError, match=rf"the valid split of .* packs into {too_many - 1} sequences "
                                        rf".* \(adapt.batch_size={too_many}\)"):
        write_task_pairs(reviews, "classification", tiny_encoder, 32, too_many, tmp_path / "again")


@pytest.mark.slow
def test_the_adapted_encoder_continues_the_pretrained_one_and_fine_tunes(reviews, tiny_encoder, tmp_path):
    out = tmp_path / "adapted"
    stats = adapt_task(SMALL, REVIEWS, section(ModelConfig), PRETRAIN, reviews, tiny_encoder, out,
                       tmp_path / "work")
    assert stats["adapted"] and stats["steps"] == 4 and stats["init_from"] == START
    # Held-out MLM before (the encoder as it came) and after: the start is measured.
    assert "start_mlm_accuracy" in stats and stats["mlm_accuracy"] is not None
    info = read_encoder_info(out)
    assert info.init_from == START and info.config == read_encoder_info(tiny_encoder).config
    before, after = read_weights(tiny_encoder / "model.safetensors"), read_weights(out / "model.safetensors")
    assert before.keys() == after.keys()  # every head carried on, none started fresh
    assert not torch.equal(before["bert.encoder.layer.0.attention.self.query.weight"],
                           after["bert.encoder.layer.0.attention.self.query.weight"])
    assert not (tmp_path / "work" / "pairs").exists()  # the packed text was scratch space

    cfg = section(FinetuneConfig, tasks={"reviews": REVIEWS}, seeds=[1], init=["pretrained", "adapted"],
                  batch_size=16)
    fits = finetune_start("reviews", REVIEWS, cfg, init="adapted", task_dir=reviews, encoder_dir=tiny_encoder,
                          out_dir=tmp_path / "model", weights_dir=out)["fits"]
    assert set(fits) == {"adapted-s1"}
    assert read_task_model_info(tmp_path / "model" / "model").fit == "adapted-s1"  # the start's own model


def test_the_adapted_start_without_an_adapted_encoder_is_one_clear_error(reviews, tiny_encoder, tmp_path):
    out = tmp_path / "adapted"
    out.mkdir()
    cfg = section(FinetuneConfig, tasks={"reviews": REVIEWS}, init=["pretrained", "adapted"])
    with pytest.raises(DataError, match="holds no adapted encoder; run the adapt stage"):
        finetune_start("reviews", REVIEWS, cfg, init="adapted", task_dir=reviews, encoder_dir=tiny_encoder,
                       out_dir=tmp_path / "model", weights_dir=out)
    assert not (tmp_path / "model").exists()
