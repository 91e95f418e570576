"""The `distilled` start: a teacher fine-tuned per task (teacher@task), a transfer set of the
training split and its MLM-augmented copies labelled with the teacher's soft targets
(transfer_set@task), and the student fine-tuned on them (distill@task)."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from components.core.config import DistillConfig, FinetuneConfig
from components.core.errors import ConfigError, DataError
from components.core.params import load_params
from components.data.tasks.folder import read_meta, read_split
from components.data.tasks.prepare import prepare_task
from components.data.tokenizer import load
from components.data.transfer_set import TRANSFER_FILE, read_transfer
from components.evaluation.tables import summarize
from components.evaluation.transfer import transfer_report
from components.model.checkpoint import cut_checkpoint, import_checkpoint
from components.model.folders import read_weights
from components.model.heads import CRF
from components.model.metadata import read_checkpoint_info, read_task_model_info
from components.training.augment import augment
from components.training.finetune import distill_student
from components.training.student import student_encoder
from components.training.teacher import fit_teacher
from components.training.transfer_set import build_transfer, corpus_rows, new_pairs
from tests.conftest import PACKAGES, section, small_params, task_config, write_params
from tests.test_finetune import _user_files

FAST = {"lr": 3e-3, "teacher_lr": 3e-3, "epochs": 1}  # one rate each (no search), one epoch
TASKS = {
    "reviews": task_config("classification", "user/reviews.csv",
                           columns={"text": "review", "label": "verdict"}, **FAST),
    "pairs": task_config("pair", "user/pairs.jsonl", **FAST),
    "ner": task_config("token", "user/ner.conll", **FAST),
    "ner-span": task_config("span", "user/ner.conll", max_span_words=3, **FAST),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    _user_files(root / "user")
    for name, task in TASKS.items():
        prepare_task(name, task, root, root / "packages", root / "tasks" / name)
    return root


def _distill(teacher: str, **changes) -> DistillConfig:
    return section(DistillConfig, teacher=teacher, **changes)


def _cfg(name: str, **changes) -> FinetuneConfig:
    return section(FinetuneConfig, **{"tasks": {name: TASKS[name]}, "seeds": [1], "batch_size": 16,
                                      "min_steps": 4, **changes})


def test_crf_marginals_are_the_sum_over_every_tag_path():
    torch.manual_seed(0)
    crf = CRF(3)
    for p in crf.parameters():
        torch.nn.init.normal_(p)
    emissions = torch.randn(2, 4, 3)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    found = crf.log_marginals(emissions, mask).exp()
    for b, n in enumerate(mask.sum(1).tolist()):
        expected = torch.zeros(n, 3)
        for path in itertools.product(range(3), repeat=n):
            score = (crf.start[path[0]] + crf.end[path[-1]]
                     + sum(emissions[b, w, t] for w, t in enumerate(path))
                     + sum(crf.transitions[a, c] for a, c in itertools.pairwise(path)))
            for w, t in enumerate(path):
                expected[w, t] += score.exp()
        torch.testing.assert_close(found[b, :n], expected / expected.sum(1, keepdim=True))


def test_augmented_copies_replace_only_one_piece_words_and_keep_every_word_count(project, tiny_encoder):
    tok = load(tiny_encoder)
    for name, field in (("reviews", "text"), ("ner", "tokens")):
        train = read_split(project / "tasks" / name, "train")
        copies, again = (augment(train, TASKS[name].kind, tiny_encoder, copies=2, prob=0.5, top_k=5, seed=3,
                                 max_len=32) for _ in range(2))
        assert copies.num_rows == 2 * train.num_rows
        assert copies.equals(again)  # seeded
        changed = 0
        for source, copy in zip(train[field].to_pylist() * 2, copies[field].to_pylist(), strict=True):
            before = source.split() if isinstance(source, str) else source
            after = copy.split() if isinstance(copy, str) else copy
            assert len(before) == len(after)
            for a, b in zip(before, after, strict=True):
                if a != b:
                    changed += 1
                    assert a.isalpha() and len(tok.encode(a, add_special_tokens=False).ids) == 1
                    assert b.isalpha() and tok.token_to_id(b) is not None  # a whole vocabulary word
        assert changed > 0
        untouched = [c for c in copies.column_names if c != field]
        assert all(copies[c].to_pylist() == train[c].to_pylist() * 2 for c in untouched)
    none = augment(train, "token", tiny_encoder, copies=0, prob=0.5, top_k=5, seed=3, max_len=32)
    assert none.num_rows == 0


@pytest.mark.slow
# One text task and both tagging heads here; classification runs through the pipeline test below.
@pytest.mark.parametrize("name", ["pairs", "ner", "ner-span"])
def test_the_student_learns_from_the_teachers_soft_targets_on_the_transfer_set(
        name, project, tiny_encoder, tiny_modern_encoder, stages_dir, tmp_path):
    task, task_dir = TASKS[name], project / "tasks" / name
    if task.kind in ("token", "span"):  # news sentences, labelled by the teacher, for the tagging tasks
        task = task.model_copy(update={"transfer_corpus": "news-articles"})
    else:  # new pairs of the training texts
        task = task.model_copy(update={"transfer_pairs": 10, "pair_link": read_meta(task_dir)["labels"][0]})
    cfg = _cfg(name, init=["pretrained", "distilled"])
    distill = _distill(str(tiny_encoder), augment_copies=1, corpus_rows=20)  # any checkpoint folder teaches
    teacher = fit_teacher(name, task, cfg, distill, project, project / "packages", task_dir,
                          tmp_path / "teacher")
    assert set(teacher["scores"]) == {"teacher-s1"} and 0 <= teacher["test_mean"] <= 1
    assert (tmp_path / "teacher" / "model" / "model.safetensors").is_file()  # a task model, servable

    stats = build_transfer(name, task, cfg, distill, task_dir, tiny_modern_encoder,
                           tmp_path / "teacher", tmp_path / "transfer", stages_dir / "clean")
    train, corpus = read_split(task_dir, "train").num_rows, 20 if task.transfer_corpus else 0
    paired = task.transfer_pairs
    assert (stats["rows"], stats["augmented_rows"]) == (2 * train + corpus + paired, train)
    assert (stats["corpus_rows"], stats["paired_rows"]) == (corpus, paired)
    table = pq.read_table(tmp_path / "transfer" / TRANSFER_FILE)
    assert table["gold"].to_pylist() == [True] * train + [False] * (train + corpus + paired)
    assert table["source"].to_pylist() == (["train"] * train + ["augmented"] * train + ["corpus"] * corpus
                                           + ["paired"] * paired)
    _, targets = read_transfer(tmp_path / "transfer", name, task.kind, read_meta(task_dir))
    for t in targets:  # distributions: per row, per word or per span
        np.testing.assert_allclose(np.exp(t.astype(np.float64)).sum(-1), 1, atol=1e-4)

    fits = distill_student(name, task, cfg, distill, task_dir=task_dir, encoder_dir=tiny_modern_encoder,
                           transfer_dir=tmp_path / "transfer", out_dir=tmp_path / "distilled")
    assert set(fits["fits"]) == {"distilled-s1"}
    assert fits["transfer_examples"] >= 2 * train + corpus + paired
    assert (tmp_path / "distilled" / "fits" / "distilled-s1.parquet").is_file()
    assert read_task_model_info(tmp_path / "distilled" / "model").fit == "distilled-s1"  # the start's own


def test_new_pairs_join_training_texts_half_of_the_time_through_their_linked_gold_pairs():
    # a-b-c linked by "same" pairs (a chain), d-e too, f by none.
    train = pa.table({"text_a": ["a", "b", "d", "a"], "text_b": ["b", "c", "e", "f"],
                      "label": ["same", "same", "same", "different"]})
    group = {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 2}
    gold = set(zip(train["text_a"].to_pylist(), train["text_b"].to_pylist(), strict=True))

    def drawn(link: str) -> list[tuple[str, str]]:
        table = new_pairs(train, 400, link, ["different", "same"], seed=1)
        assert table.schema == train.schema and table.num_rows == 400
        return list(zip(table["text_a"].to_pylist(), table["text_b"].to_pylist(), strict=True))

    linked, unlinked = drawn("same"), drawn("")
    for pairs in (linked, unlinked):  # no text with itself, no gold pair again
        assert not [p for p in pairs if p[0] == p[1] or p in gold]

    def same_group(pairs: list) -> float:
        return sum(group[a] == group[b] for a, b in pairs) / len(pairs)

    assert same_group(linked) > same_group(unlinked) + 0.1  # the linked half, on top of chance
    assert linked == drawn("same")  # seeded
    with pytest.raises(DataError, match=r"pair_link 'equal' is not a label of the task \(different, same\)"):
        new_pairs(train, 5, "equal", ["different", "same"], seed=1)


@pytest.fixture(scope="module")
def reviews_teacher(project, tiny_encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "reviews"
    fit_teacher("reviews", TASKS["reviews"], _cfg("reviews", init=["pretrained", "distilled"]),
                _distill(str(tiny_encoder)), project, project / "packages", project / "tasks" / "reviews",
                out)
    return out


def test_a_missing_teacher_or_one_of_another_task_is_refused_by_name(project, tiny_encoder, reviews_teacher,
                                                                       tmp_path):
    cfg, distill = _cfg("ner", init=["pretrained", "distilled"]), _distill(str(tiny_encoder))
    ner = project / "tasks" / "ner"
    with pytest.raises(DataError, match=r"no teacher; run teacher@ner"):
        build_transfer("ner", TASKS["ner"], cfg, distill, ner, tiny_encoder, tmp_path / "none",
                       tmp_path / "t")
    with pytest.raises(DataError, match=r"a teacher of a classification task with labels \['neg', 'pos'\], "
                                        r"but task ner is token"):
        build_transfer("ner", TASKS["ner"], cfg, distill, ner, tiny_encoder, reviews_teacher,
                       tmp_path / "t")
    assert not (tmp_path / "t").exists()  # nothing half-written


def test_a_student_without_its_transfer_set_or_with_another_tasks_is_refused(project, tiny_encoder,
                                                                               reviews_teacher, tmp_path):
    reviews = project / "tasks" / "reviews"
    cfg = _cfg("reviews", init=["pretrained", "distilled"])
    distill = _distill(str(tiny_encoder), augment_copies=0)
    with pytest.raises(DataError, match=r"no transfer set; finetune.init has distilled, so run "
                                        r"teacher@reviews and transfer_set@reviews first"):
        distill_student("reviews", TASKS["reviews"], cfg, distill, task_dir=reviews, encoder_dir=tiny_encoder,
                        transfer_dir=tmp_path / "missing", out_dir=tmp_path / "m")
    build_transfer("reviews", TASKS["reviews"], cfg, distill, reviews, tiny_encoder, reviews_teacher,
                   tmp_path / "transfer")
    with pytest.raises(DataError, match=r"labelled by a teacher of task 'reviews' .* not of 'other'"):
        distill_student("other", TASKS["reviews"], cfg, distill, task_dir=reviews, encoder_dir=tiny_encoder,
                        transfer_dir=tmp_path / "transfer", out_dir=tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_cut_keeps_the_chosen_layers_of_the_checkpoint_renumbered(tiny_modern_encoder, tmp_path):
    import_checkpoint("all-minilm-l6-v2", tmp_path, PACKAGES, tmp_path / "minilm")
    cut = cut_checkpoint(tmp_path / "minilm", [1, 4], tmp_path / "cut")
    assert (cut.layers, cut.hidden) == (2, 384)
    assert read_checkpoint_info(tmp_path / "cut").config == cut
    assert json.loads((tmp_path / "cut" / "config.json").read_text())["num_hidden_layers"] == 2
    teacher, student = (read_weights(tmp_path / d / "model.safetensors") for d in ("minilm", "cut"))
    block = "bert.encoder.layer.{}.attention.self.query.weight"
    assert torch.equal(student[block.format(0)], teacher[block.format(1)])
    assert torch.equal(student[block.format(1)], teacher[block.format(4)])
    assert block.format(2) not in student
    assert torch.equal(student["bert.embeddings.word_embeddings.weight"],
                       teacher["bert.embeddings.word_embeddings.weight"])
    with pytest.raises(ConfigError, match=r"student_layers \[6\]: .*minilm has layers 0 to 5"):
        cut_checkpoint(tmp_path / "minilm", [6], tmp_path / "bad")
    import_checkpoint(str(tiny_modern_encoder), tmp_path, PACKAGES, tmp_path / "modern")
    with pytest.raises(ConfigError, match=r"is a modern encoder; only a classic one is cut"):
        cut_checkpoint(tmp_path / "modern", [0], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="distinct layer indices, ascending"):
        _distill("all-minilm-l6-v2", student_layers=[2, 1])


@pytest.mark.slow
def test_a_student_cut_from_the_teacher_trains_with_its_own_tokenizer_at_the_teachers_rate(
        project, tiny_encoder, tiny_modern_encoder, reviews_teacher, tmp_path):
    reviews = project / "tasks" / "reviews"
    task = TASKS["reviews"].model_copy(update={"lr": [1e-3]})
    cfg = _cfg("reviews", init=["distilled", "pretrained"])
    distill = _distill("all-minilm-l6-v2", augment_copies=0, student_layers=[0])
    build_transfer("reviews", task, cfg, distill, reviews, tiny_encoder, reviews_teacher,
                   tmp_path / "transfer")
    with student_encoder(distill.model_copy(update={"student_layers": []}), project, PACKAGES,
                         tmp_path) as none:
        assert none is None  # the student is the pretrained encoder
    with student_encoder(distill, project, PACKAGES, tmp_path) as student:
        fits = distill_student("reviews", task, cfg, distill, task_dir=reviews,
                               encoder_dir=tiny_modern_encoder, transfer_dir=tmp_path / "transfer",
                               out_dir=tmp_path / "m", student_dir=student)
    assert not student.exists()  # built for the stage, gone after it
    # The teacher's rate (teacher_lr), not the task's lr that the other starts train at.
    assert {k: f["lr"] for k, f in fits["fits"].items()} == {"distilled-s1": 3e-3}
    exported = read_task_model_info(tmp_path / "m" / "model")  # the distilled start's: the student
    assert (exported.config.arch, exported.config.layers, exported.config.hidden) == ("classic", 1, 384)
    assert load(tmp_path / "m" / "model").get_vocab_size() == 30522  # MiniLM's tokenizer, not ours


def test_the_transfer_table_says_which_student_was_distilled(tmp_path):
    metrics = tmp_path / "tasks" / "reviews"
    metrics.mkdir(parents=True)
    scores = {"pretrained": [0.80, 0.82], "distilled": [0.85, 0.86], "scratch": [0.70, 0.72]}
    (metrics / "evaluate_stats.json").write_text(json.dumps({
        "kind": "classification", "metric": "accuracy",
        "primary": {init: summarize(values) for init, values in scores.items()},
        "fits": {f"{init}-s{seed}": {"accuracy": values[seed - 1], "steps": 10, "lr": 1e-3}
                 for init, values in scores.items() for seed in (1, 2)}}))
    (metrics / "teacher_stats.json").write_text(json.dumps({
        "teacher": "all-minilm-l6-v2", "scores": {"teacher-s1": {"test": 0.9, "valid": 0.9}}}))
    for layers, student in (([0, 1], "layers 0, 1 of all-minilm-l6-v2, the teacher's checkpoint"),
                            ([], "the pretrained encoder")):
        transfer_report(["reviews"], tmp_path / "tasks", tmp_path / "transfer.md", tmp_path / "transfer.json",
                        student_layers=layers, teacher="all-minilm-l6-v2")
        assert f"*distilled*: {student}" in (tmp_path / "transfer.md").read_text()


def test_corpus_text_comes_from_the_named_source_of_the_training_part_only(project, stages_dir):
    clean = stages_dir / "clean"
    heldout = {s for shard in (clean / "heldout").glob("*.parquet")
               for doc in pq.read_table(shard)["sentences"].to_pylist() for s in doc}
    train = read_split(project / "tasks" / "ner", "train")
    rows = corpus_rows(clean, "news-articles", "token", train, 50, seed=0)
    assert rows.num_rows == 50 and rows.schema == train.schema
    assert all(len(words) >= 3 and set(tags) == {train["tags"][0].as_py()[0]}
               for words, tags in zip(rows["tokens"].to_pylist(), rows["tags"].to_pylist(), strict=True))
    assert not {" ".join(w) for w in rows["tokens"].to_pylist()} & {" ".join(s.split()) for s in heldout}
    docs = corpus_rows(clean, "sotu", "classification", read_split(project / "tasks" / "reviews", "train"),
                       3, 0)
    assert docs.num_rows == 3 and all(len(t) > 200 for t in docs["text"].to_pylist())  # whole speeches
    with pytest.raises(DataError, match=r"transfer_corpus 'tweets': no documents of that source in .*/train"):
        corpus_rows(clean, "tweets", "token", train, 5, 0)


@pytest.mark.slow
def test_the_distilled_start_runs_through_the_pipeline_and_its_student_is_the_served_model(tiny_encoder,
                                                                                            tmp_path):
    import yaml

    from components.core import tracking
    from components.model.metadata import read_task_model_info
    from tests.conftest import make_task_project, run_cli

    repo = make_task_project(
        tmp_path / "project",
        {"reviews": {"kind": "classification", "source": "data/user/tasks/reviews.csv",
                     "columns": {"text": "review", "label": "verdict"}},
         "ner": {"kind": "token", "source": "data/user/tasks/ner.conll", "transfer_corpus": "news-articles"}},
        finetune={"init": ["distilled", "pretrained"], "task_defaults": {"epochs": 2, "teacher_lr": 0.003}},
        distill={"teacher": str(tiny_encoder), "corpus_rows": 30})
    out = run_cli("bertflow", "run", cwd=repo).stdout
    ran = [line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["ran"]]
    client = tracking.client(load_params(repo / "params.yaml").tracking, repo)
    for task in ("reviews", "ner"):
        assert {f"teacher@{task}", f"transfer_set@{task}", f"distill@{task}", f"finetune@{task}-pretrained",
                f"evaluate@{task}"} <= set(ran)
        metrics = repo / "metrics" / "tasks" / task
        assert set(json.loads((metrics / "distill_stats.json").read_text())["fits"]) == {"distilled-s1"}
        assert set(json.loads((metrics / "finetune-pretrained_stats.json").read_text())["fits"]) == \
            {"pretrained-s1"}
        assert set(json.loads((metrics / "evaluate_stats.json").read_text())["fits"]) == \
            {"distilled-s1", "pretrained-s1"}
        # finetune.init's first start is the registered one: the student.
        models = repo / "data" / "models" / "tasks" / task
        assert read_task_model_info(models / "distilled" / "model").fit == "distilled-s1"
        champion = client.get_model_version_by_alias(task, "champion")
        assert champion.tags["bertflow.fit"] == "distilled-s1"
    corpus = json.loads((repo / "metrics" / "tasks" / "ner" / "transfer_set_stats.json").read_text())
    assert corpus["corpus_rows"] == 30
    header = (repo / "metrics" / "transfer.md").read_text().split("\n| task |", 1)[1].split("\n")[0]
    assert "| distilled | teacher | pretrained |" not in header  # arms in ARMS order:
    assert "| pretrained | distilled | teacher |" in header and "| distillation | of teacher |" in header
    assert "didn't change, skipping" in run_cli("dvc", "repro", cwd=repo).stdout
    # The student's own settings rerun neither the teacher nor the transfer set.
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["distill"]["temperature"] = 3.0
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = run_cli("dvc", "status", cwd=repo).stdout
    assert "distill@reviews" in status and "teacher@" not in status and "transfer_set@" not in status
    assert "finetune@" not in status  # nor the other starts' fits


def _load_with_teacher(project, **distill):
    """load_params of a project in `project` with the distilled start and these distill settings."""
    return load_params(write_params(project, small_params(finetune={"init": ["distilled", "pretrained"]},
                                                          distill=distill)))


@pytest.mark.parametrize("teacher, expected", [
    ("", r"distill.teacher: is empty: name a packaged checkpoint or a model folder"),
    ("/etc", r"distill.teacher: '/etc' is not a checkpoint folder in transformers' layout \(config.json, "
             r"model.safetensors, tokenizer.json or vocab.txt\): /etc has no config.json, model.safetensors"),
    ("data/user/teacher/", r"distill.teacher: 'data/user/teacher' is not a packaged checkpoint "
                           r"\(all-minilm-l6-v2\), nor a folder \(.*/data/user/teacher is missing\)"),
    ("bert-base-uncased", r"distill.teacher: 'bert-base-uncased' is not a packaged checkpoint "
                          r"\(all-minilm-l6-v2\), nor a folder \(.*/bert-base-uncased is missing\)"),
    ("params.yaml", r"distill.teacher: 'params.yaml' is not a packaged checkpoint .* is a file\)"),
])
def test_a_teacher_that_is_no_checkpoint_is_refused_at_load(tmp_path, teacher, expected):
    # Before ingest and pretraining run, not at the teacher stage after them.
    with pytest.raises(ConfigError) as err:
        _load_with_teacher(tmp_path, teacher=teacher)
    assert re.fullmatch(f"{re.escape(str(tmp_path / 'params.yaml'))}:{expected}.*", str(err.value)), err.value
    assert "\n" not in str(err.value)


def test_a_student_s_layers_are_checked_against_the_teacher_at_load(tmp_path):
    import shutil

    from components.model.packaged import source_dir

    with pytest.raises(ConfigError, match=re.escape("params.yaml:distill.student_layers: [0, 99]: "
                                                    "the teacher all-minilm-l6-v2 has 6 layers (0 to 5)")):
        _load_with_teacher(tmp_path, student_layers=[0, 99])
    # A folder teacher: its config.json says how many layers it has (no torch at load).
    shutil.copytree(source_dir("all-minilm-l6-v2", tmp_path, PACKAGES), tmp_path / "data" / "user" / "minilm")
    with pytest.raises(ConfigError, match=re.escape("params.yaml:distill.student_layers: [0, 6]: "
                                                    "the teacher data/user/minilm has 6 layers (0 to 5)")):
        _load_with_teacher(tmp_path, teacher="./data/user/minilm/", student_layers=[0, 6])
    p = _load_with_teacher(tmp_path, teacher="./data/user/minilm/", student_layers=[0, 5])
    assert p.distill.teacher == "data/user/minilm"
    (tmp_path / "data" / "user" / "minilm" / "tokenizer.json").unlink()
    (tmp_path / "data" / "user" / "minilm" / "vocab.txt").unlink()
    with pytest.raises(ConfigError, match=r"distill.teacher: 'data/user/minilm' is not a checkpoint folder "
                                          r".*: .*minilm has no tokenizer.json or vocab.txt$"):
        _load_with_teacher(tmp_path, teacher="data/user/minilm")
    # Without the distilled start no stage reads the teacher: a folder not made yet is no error.
    unused = small_params(distill={"teacher": "data/user/later", "student_layers": [0, 99]})
    assert load_params(write_params(tmp_path, unused)).distill.teacher == "data/user/later"


def test_a_modern_teacher_is_not_cut_into_a_student_and_this_is_said_at_load(tmp_path, tiny_modern_encoder):
    with pytest.raises(ConfigError, match=re.escape(
            f"params.yaml:distill.student_layers: [0]: the teacher {tiny_modern_encoder} is a ModernBERT "
            "encoder; only a classic one is cut")):
        _load_with_teacher(tmp_path, teacher=str(tiny_modern_encoder), student_layers=[0])
    assert _load_with_teacher(tmp_path, teacher=str(tiny_modern_encoder)).distill.student_layers == []


def test_the_loader_knows_each_packaged_checkpoint_s_layers_as_installed(tmp_path):
    # The loader checks student_layers before anything is installed, from the table's count.
    from components.core.packages import CHECKPOINTS
    from components.model.packaged import source_dir

    for name, packaged in CHECKPOINTS.items():
        config = json.loads((source_dir(name, tmp_path, PACKAGES) / "config.json").read_text())
        assert config["num_hidden_layers"] == packaged.layers, name
