"""The data pipeline under real Prefect, DVC (temp git repo), MLflow (sqlite) and GX."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from tests.conftest import run_cli

pytestmark = pytest.mark.usefixtures("prefect_api")  # one Prefect server for the runs

DATA_STAGES = ["ingest", "clean", "checkpoint", "tokenizer", "pairs"]


def _statuses(results: dict) -> dict[str, str]:
    return {name: r["status"] for name, r in results.items()}


def _dvc_clean(repo, target: str = "pairs") -> bool:
    # Status of the data stages only: pretrain is in dvc.yaml too but these tests stop at pairs.
    out = run_cli("dvc", "status", "--with-deps", target, cwd=repo).stdout
    return "Data and pipelines are up to date" in out


def _lock_out(repo, stage: str) -> str:
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return lock["stages"][stage]["outs"][0]["md5"]


@pytest.mark.slow
def test_flow_runs_what_dvc_finds_stale_and_records_it(dvc_project, prefect_api):
    from pipeline.flow import pipeline_flow

    repo, params = dvc_project, str(dvc_project / "params.yaml")
    first = pipeline_flow(params, "pairs")
    assert _statuses(first) == dict.fromkeys(DATA_STAGES, "ran")
    assert _dvc_clean(repo)
    # The flow's records are DVC's own to the byte (it reads dvc.lock by libyaml to record a
    # stage; DVC's CLI rereads it round trip and writes it again).
    lock = (repo / "dvc.lock").read_bytes()
    run_cli("dvc", "commit", "--force", "--with-deps", "pairs", cwd=repo)
    assert (repo / "dvc.lock").read_bytes() == lock
    assert (repo / "metrics" / "pairs_stats.json").exists()

    assert _statuses(pipeline_flow(params, "pairs")) == dict.fromkeys(DATA_STAGES, "skipped")
    _killed_while_recording(repo, "pairs")
    (repo / ".dvc" / "tmp" / "rwlock").write_text('{"read": {"data/')  # cut mid-rewrite
    assert _statuses(pipeline_flow(params, "pairs")) == {
        **dict.fromkeys(DATA_STAGES, "skipped"), "pairs": "ran"}
    assert _dvc_clean(repo)
    assert not (repo / ".dvc" / "tmp" / "dvc.lock.before-commit").exists()
    json.loads((repo / ".dvc" / "tmp" / "rwlock").read_text())  # DVC's own again

    data = yaml.safe_load((repo / "params.yaml").read_text())
    data["tokenizer"]["vocab_size"] = 1500
    (repo / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert _statuses(pipeline_flow(params, "pairs")) == {
        "ingest": "skipped", "clean": "skipped", "checkpoint": "skipped", "tokenizer": "ran",
        "pairs": "ran"}
    assert _dvc_clean(repo)

    # The DVC path runs the same stage code through the CLI, and agrees that nothing is stale.
    assert "didn't change, skipping" in run_cli("dvc", "repro", "pairs", cwd=repo).stdout
    data["pairs"]["seed"] = 7
    (repo / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    out = run_cli("dvc", "repro", "pairs", cwd=repo).stdout
    assert "Running stage 'pairs'" in out and "Running stage 'tokenizer'" not in out
    assert _dvc_clean(repo)

    # The default local remote: push, lose the data and the cache, pull it back.
    run_cli("dvc", "push", "--with-deps", "pairs", cwd=repo)
    shutil.rmtree(repo / "data" / "pairs")
    shutil.rmtree(repo / ".dvc" / "cache")
    run_cli("dvc", "pull", "--with-deps", "pairs", cwd=repo)
    assert _dvc_clean(repo)

    _check_mlflow(repo)
    _check_prefect_artifact()
    _check_a_preset(repo)


def _check_a_preset(repo) -> None:
    """A preset is a DVC pipeline of its own (presets/NAME/dvc.yaml) holding the stages that are
    not the default run's; those that are stay in dvc.lock, run or skipped there, and its own
    stages take their outputs as DVC deps. It may not write where the default run writes."""
    from components.core.errors import ConfigError
    from pipeline.flow import pipeline_flow
    from pipeline.presets import owners

    lock = (repo / "dvc.lock").read_bytes()
    preset = {"extends": "params.yaml", "tokenizer": {"vocab_size": 1800}}
    (repo / "clash.yaml").write_text(yaml.safe_dump(preset))
    with pytest.raises(ConfigError, match=r"clash.yaml: stage tokenizer would write data/tokenizer, .* "
                                          r"\(paths.tokenizer in clash.yaml\)"):
        owners(repo / "clash.yaml", "pairs")
    preset["paths"] = {"tokenizer": "data/preset/tokenizer", "pairs": "data/preset/pairs",
                       "models": "data/preset/models", "metrics": "metrics/preset"}
    (repo / "preset.yaml").write_text(yaml.safe_dump(preset))
    assert _statuses(pipeline_flow(str(repo / "preset.yaml"), "pairs")) == {
        "ingest": "skipped", "clean": "skipped", "checkpoint": "skipped", "tokenizer": "ran", "pairs": "ran"}
    pipeline = yaml.safe_load((repo / "presets" / "preset" / "dvc.yaml").read_text())["stages"]
    assert list(pipeline)[:3] == ["tokenizer", "pairs", "pretrain"]  # the corpus is the default run's
    assert not any(name.startswith("task_data") for name in pipeline)  # the task data too
    assert "data/clean" in pipeline["tokenizer"]["deps"]
    assert pipeline["tokenizer"]["params"] == [{"preset.yaml": ["tokenizer"]},
                                               {"params.yaml": ["tokenizer", "model.max_position",
                                                                "pretrain.init_from"]}]
    stats = json.loads((repo / "metrics" / "preset" / "tokenizer_stats.json").read_text())
    assert stats["vocab_size"] == 1800 and (repo / "data" / "preset" / "pairs").is_dir()
    assert not (repo / "metrics" / "preset" / "clean_stats.json").exists()  # the default run's stage
    assert (repo / "dvc.lock").read_bytes() == lock and (repo / "presets" / "preset" / "dvc.lock").is_file()
    assert _dvc_clean(repo) and _dvc_clean(repo, "presets/preset/dvc.yaml:pairs")  # DVC keeps both books
    # An edit of the preset reruns what it touches, as DVC decides.
    preset["pairs"] = {"seed": 8}
    (repo / "preset.yaml").write_text(yaml.safe_dump(preset))
    assert _statuses(pipeline_flow(str(repo / "preset.yaml"), "pairs")) == {
        **dict.fromkeys(DATA_STAGES, "skipped"), "pairs": "ran"}
    # DVC runs the preset's pipeline as the flow does.
    preset["pairs"] = {"seed": 9}
    (repo / "preset.yaml").write_text(yaml.safe_dump(preset))
    out = run_cli("dvc", "repro", "presets/preset/dvc.yaml:pairs", cwd=repo).stdout
    ran = re.findall(r"Running stage '([^']+)'", out)
    assert ran == ["presets/preset/dvc.yaml:pairs"], out
    rerun = pipeline_flow(str(repo / "preset.yaml"), "pairs")
    assert _statuses(rerun) == dict.fromkeys(DATA_STAGES, "skipped")


def _killed_while_recording(repo, stage: str) -> None:
    """What a SIGKILL inside `dvc commit STAGE` leaves: DVC rewrites dvc.lock in place, so it is
    cut off mid-file; the copy kept aside holds dvc.lock from before, without STAGE's entry."""
    lock = repo / "dvc.lock"
    before = yaml.safe_load(lock.read_text())
    del before["stages"][stage]
    (repo / ".dvc" / "tmp" / "dvc.lock.before-commit").write_text(yaml.safe_dump(before))
    lock.write_text(lock.read_text()[: len(lock.read_text()) // 2])


def _check_mlflow(repo) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bertflow")
    runs = client.search_runs([exp.experiment_id], order_by=["start_time ASC"])
    parents = [r for r in runs if r.info.run_name == "pipeline"]
    assert len(parents) == 4
    first = parents[0].info.run_id
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == first}
    assert set(children) == set(DATA_STAGES)
    head = run_cli("git", "rev-parse", "HEAD", cwd=repo).stdout.strip()
    for name, r in children.items():
        assert r.info.status == "FINISHED"
        assert r.data.tags["git.commit"] == head
        assert r.data.tags["bertflow.stage"] == name
    # Lineage: the hashes dvc.lock records for each stage's data deps.
    assert children["clean"].data.tags["dvc.dep.data/raw"] == _lock_out(repo, "ingest")
    assert children["tokenizer"].data.tags["dvc.dep.data/clean"] == _lock_out(repo, "clean")
    assert children["pairs"].data.tags["dvc.dep.data/clean"] == _lock_out(repo, "clean")
    # Stats as metrics, params as params, artifacts attached.
    assert children["clean"].data.metrics["documents_out"] > 100
    assert children["pairs"].data.params["pairs.max_seq_len"] == "128"
    assert children["tokenizer"].data.params["tokenizer.vocab_size"] == "2000"
    artifacts = {a.path for a in client.list_artifacts(children["tokenizer"].info.run_id)}
    assert {"tokenizer", "tokenizer_stats.json"} <= artifacts
    # A skipped stage is recorded as such under its pipeline run, with the same lineage.
    second = parents[1].info.run_id
    skipped = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == second}
    assert {r.data.tags["bertflow.status"] for r in skipped.values()} == {"skipped"}
    assert skipped["pairs"].data.tags["dvc.dep.data/clean"] == _lock_out(repo, "clean")
    assert skipped["pairs"].data.tags["git.commit"] == head
    assert skipped["clean"].data.metrics["documents_out"] == children["clean"].data.metrics["documents_out"]
    assert skipped["pairs"].data.params["pairs.max_seq_len"] == "128"


def _check_prefect_artifact() -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["bertflow-run-summary"])))
    tables = [a.data for a in artifacts]
    assert any("| pairs | ran |" in t for t in tables)
    assert any("| ingest | skipped |" in t for t in tables)


@pytest.mark.slow
def test_cli_run_until_and_dvc_repro_from_scratch(dvc_project):
    # The two entry points of the README, as subprocesses: `dvc repro` and `bertflow run`.
    repo = dvc_project
    out = run_cli("dvc", "repro", "tokenizer", cwd=repo).stdout
    assert "Running stage 'ingest'" in out and "Running stage 'pairs'" not in out
    proc = run_cli("bertflow", "run", "--until", "pairs", cwd=repo)
    lines = dict(line.split()[:2] for line in proc.stdout.splitlines() if line.split()[:1] and
                 line.split()[0] in DATA_STAGES)
    assert lines == {"ingest": "skipped", "clean": "skipped", "checkpoint": "skipped",
                     "tokenizer": "skipped", "pairs": "ran"}
    assert _dvc_clean(repo)


def test_each_preset_pipeline_holds_only_the_stages_that_are_not_its_bases():
    from pipeline.pipelines import is_preset
    from pipeline.presets import owners, render
    from tests.conftest import ROOT

    held = {f.name: {n for n, o in owners(f).items() if o == f} for f in sorted(ROOT.glob("params-*.yaml"))}
    # The distillation preset pretrains nothing and fits no pretrained or scratch start: the
    # default run's encoder, task data and fits are its deps.
    assert not {"ingest", "clean", "tokenizer", "pairs", "pretrain"} & held["params-distill.yaml"]
    assert "finetune@trec-6-pretrained" not in held["params-distill.yaml"] and "distill@trec-6" in held[
        "params-distill.yaml"]
    distill = yaml.safe_load(render(ROOT / "params-distill.yaml"))["stages"]
    assert "data/models/tasks/trec-6/pretrained" in distill["evaluate__trec-6"]["deps"]
    # A preset of another tokenizer shares the corpus and the task data only; one extending it
    # shares its tokenizer and pairs (its pipeline holds the stages of the new heads' pretraining).
    assert {"tokenizer", "pairs", "pretrain"} <= held["params-minilm.yaml"]
    assert not {"ingest", "clean", "task_data@trec-6"} & held["params-minilm.yaml"]
    heads = owners(ROOT / "params-minilm-heads.yaml")
    assert (heads["pairs"].name, heads["pretrain"].name) == ("params-minilm.yaml", "params-minilm-heads.yaml")
    assert all(is_preset(f) for f in heads.values() if f.name != "params.yaml")


@pytest.mark.slow
def test_retries_transient_failures_but_not_bad_data(tmp_path, prefect_api, monkeypatch):
    import json

    import dask
    import dask.distributed  # noqa: F401  (its defaults first: see below)
    from mlflow.tracking import MlflowClient

    from components.core.errors import DataError
    from pipeline.flow import pipeline_flow
    from tests.conftest import small_params, write_params

    # An unreachable Dask scheduler is an infrastructure failure: Prefect retries it (2 retries).
    # dask.config, not the environment: Dask reads that once, when it is first imported.
    # dask.distributed is imported above so that its defaults are loaded before the set below:
    # imported inside it, they would be dropped with the set's `distributed` key on exit, and a
    # later test in this process could not start a LocalCluster.
    monkeypatch.setattr("pipeline.flow.stage_task.retry_delay_seconds", 0)
    params = write_params(tmp_path / "a", small_params(
        executor={"kind": "dask", "dask_address": "tcp://127.0.0.1:9"},
        tracking={"uri": "sqlite:///mlflow.db"}))
    with pytest.raises(OSError, match="after 1 s"), \
            dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        pipeline_flow(str(params), "clean")
    # Bad data is not retried: the same error would come back.
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.jsonl").write_text(json.dumps({"text": "A. B."}) + "\n{oops\n")
    params_b = write_params(tmp_path / "b", small_params(
        ingest={"sources": [{"name": "x", "kind": "jsonl", "path": "x.jsonl"}]},
        tracking={"uri": "sqlite:///mlflow.db"}))
    with pytest.raises(DataError, match="x.jsonl:2"):
        pipeline_flow(str(params_b), "ingest")

    def runs(folder, stage):
        client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
        exp = client.get_experiment_by_name("bertflow")
        return [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == stage]

    # Retries reopen the run of the first attempt: one MLflow run, its attempts counted.
    [clean_run] = runs(tmp_path / "a", "clean")
    assert clean_run.info.status == "FAILED" and clean_run.data.tags["bertflow.attempts"] == "3"
    [ingest_run] = runs(tmp_path / "b", "ingest")
    assert ingest_run.info.status == "FAILED" and ingest_run.data.tags["bertflow.attempts"] == "1"
    assert "x.jsonl:2" in ingest_run.data.tags["bertflow.error"]


@pytest.mark.slow
def test_a_retried_stage_that_then_succeeds_leaves_one_finished_run(tmp_path, prefect_api,
                                                                     monkeypatch):
    from mlflow.tracking import MlflowClient

    import components.data.ingest
    from pipeline.flow import pipeline_flow
    from tests.conftest import small_params, write_params

    real_ingest, calls = components.data.ingest.ingest, []

    def flaky_ingest(*args):  # the network share hiccups once, then answers
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionResetError("connection reset by peer")
        return real_ingest(*args)

    monkeypatch.setattr(components.data.ingest, "ingest", flaky_ingest)
    monkeypatch.setattr("pipeline.flow.stage_task.retry_delay_seconds", 0)
    params = write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    results = pipeline_flow(str(params), "ingest")
    assert len(calls) == 2 and results["ingest"]["stats"]["documents"] > 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bertflow")
    [run] = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == "ingest"]
    assert run.info.status == "FINISHED" and run.data.tags["bertflow.attempts"] == "2"
    assert "bertflow.error" not in run.data.tags
    assert "ConnectionResetError" in run.data.tags["bertflow.retried_after"]
    assert run.data.metrics["documents"] == results["ingest"]["stats"]["documents"]


@pytest.mark.slow
def test_a_user_task_runs_through_the_whole_pipeline_from_three_starts(dvc_project, tmp_path):
    # Your own task file takes the built-ins' place through params.yaml alone: `bertflow run`
    # goes from the corpus to the transfer table, then `dvc repro` agrees nothing is stale. A CSV
    # with other column names then joins it by `bertflow run --task`.
    import httpx
    from mlflow.tracking import MlflowClient

    from tests.test_finetune import _user_files
    from tests.test_lifecycle import _stop, serve_champion

    repo = dvc_project
    _user_files(repo / "data" / "user" / "tasks")
    data = yaml.safe_load((repo / "params.yaml").read_text())
    data["model"]["preset"] = "tiny"
    data["pretrain"].update(max_steps=30, warmup_steps=5, batch_size=16, val_every_steps=15,
                            snapshot_every_steps=15, short_seq_steps=10, accelerator="cpu")
    data["finetune"].update(
        tasks={"pos": {"kind": "token", "source": "data/user/tasks/pos.conll"}},  # plain tags
        seeds=[1], batch_size=16, init=["pretrained", "adapted"])  # more seeds: test_finetune
    data["finetune"]["task_defaults"].update(lr=0.003, epochs=4, patience=8)
    data["adapt"].update(steps=6, lr=0.001, batch_size=4, max_seq_len=16)
    (repo / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    run_cli("git", "add", "-A", cwd=repo)
    run_cli("git", "commit", "-qm", "user tasks", cwd=repo)

    # Its stderr a pipe, as in a log: progress lines (every 0.2 s here; once a minute by default)
    # from pretraining (its own process) and fine-tuning (the fits).
    proc = run_cli("bertflow", "run", cwd=repo, env={"BERTFLOW_PROGRESS_SECONDS": "0.2"})
    assert "progress: pretrain: step " in proc.stderr and "progress: finetune pos pretrained: " in proc.stderr
    out = proc.stdout
    statuses = dict(line.split()[:2] for line in out.splitlines() if line.split()[1:2] == ["ran"])
    assert list(statuses) == [*DATA_STAGES, "pretrain", "task_data@pos", "adapt@pos",
                              "finetune@pos-pretrained", "finetune@pos-adapted", "evaluate@pos", "transfer",
                              "registry"]
    assert _dvc_clean(repo, "transfer")
    assert "didn't change, skipping" in run_cli("dvc", "repro", cwd=repo).stdout
    # DVC alone decides, and an edit reruns only what it can change: the schema's docstrings, or a
    # module no stage imports, nothing; a new start, its own stage and the evaluation.
    for module in ("core/config.py", "core/params.py", "lifecycle/report.py"):
        path = repo / "components" / module
        path.write_text(path.read_text().replace('"""', '"""Edited: ', 1))
    assert _dvc_clean(repo, "transfer")
    run_cli("git", "checkout", "--", "components", cwd=repo)
    data["finetune"]["init"].append("scratch")
    (repo / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    out = run_cli("bertflow", "run", cwd=repo).stdout
    ran = [line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["ran"]]
    assert ran[:3] == ["finetune@pos-scratch", "evaluate@pos", "transfer"] and ran[3:] in ([], ["registry"])
    assert _dvc_clean(repo, "transfer")
    table = (repo / "metrics" / "transfer.md").read_text()
    # A part-of-speech file: plain tags, word accuracy, read against each word's most frequent tag.
    pos = json.loads((repo / "metrics" / "transfer.json").read_text())["pos"]
    assert (pos["metric"], pos["baseline_name"]) == ("word_accuracy", "most frequent tag")
    assert "| pos | token | word_accuracy |" in table and pos["pretrained"]["mean"] > pos["baseline"]
    # ... and its champion answers with a tag per word: the CLI, and REST.
    text = "a quick run ended"
    answer = json.loads(run_cli("bertflow", "predict", "pos", "--text", text, cwd=repo).stdout)
    assert answer["tokens"] == text.split() and answer["tags"] == ["DET", "ADJ", "NOUN", "VERB"]
    assert "entities" not in answer  # plain tags name no entities
    server, url = serve_champion(repo, "pos", tmp_path / "serve.log")
    try:
        served = httpx.post(url, json={"dataframe_records": [{"text": text}]}, timeout=60)
    finally:
        _stop(server)
    assert served.status_code == 200
    assert served.json()["predictions"] == [{"tokens": answer["tokens"], "tags": answer["tags"]}]
    stats = json.loads((repo / "metrics" / "tasks" / "pos" / "evaluate_stats.json").read_text())
    assert set(stats["fits"]) == {"pretrained-s1", "adapted-s1", "scratch-s1"}
    # The adapted start: its own stage per task, its own column.
    adapt = json.loads((repo / "metrics" / "tasks" / "pos" / "adapt_stats.json").read_text())
    assert adapt["adapted"] and adapt["steps"] == 6
    header = next(line for line in table.splitlines() if line.startswith("| task | kind |"))
    assert "| pretrained | task-adapted | from scratch | gain | adaptation |" in header
    assert stats["primary"]["pretrained"]["mean"] > 0.8

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
    finetune = next(r for r in runs if r.info.run_name == "finetune@pos-pretrained"
                    and r.data.tags["bertflow.status"] == "ran")
    assert finetune.data.params["finetune.tasks.pos.source"] == "data/user/tasks/pos.conll"
    assert finetune.data.tags["dvc.dep.data/tasks/pos"] == _lock_out(repo, "task_data@pos")
    assert "model" in {a.path for a in client.list_artifacts(finetune.info.run_id)}

    # One more task of yours, from its file to a champion in one command, the others untouched:
    # `bertflow run` writes the new file into dvc.yaml as the dep of that task's stages alone.
    shutil.copy(repo / "data" / "user" / "tasks" / "reviews.csv", repo / "data" / "user" / "more.csv")
    data["finetune"]["tasks"]["more"] = {"kind": "classification", "source": "data/user/more.csv",
                                         "columns": {"text": "review", "label": "verdict"}}
    (repo / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    proc = run_cli("bertflow", "run", "--task", "more", cwd=repo)
    ran = [line.split()[0] for line in proc.stdout.splitlines() if line.split()[1:2] == ["ran"]]
    assert ran == ["task_data@more", "adapt@more", *(f"finetune@more-{s}" for s in data["finetune"]["init"]),
                   "evaluate@more", "registry"]
    assert "dvc.yaml: brought up to date with params.yaml" in proc.stderr
    assert yaml.safe_load((repo / "dvc.yaml").read_text())["vars"][0]["task_sources"]["more"] == \
        "data/user/more.csv"
    answer = json.loads(run_cli("bertflow", "predict", "more", "--text", "the film was great",
                                cwd=repo).stdout)
    assert answer["label"] in ("pos", "neg")


def test_the_run_summary_warns_when_a_time_guard_cut_pretraining_short():
    from pipeline.flow import summary_markdown

    def pretrain(**stats):
        return {"pretrain": {"status": "ran", "seconds": 60.0, "stats": stats}}

    cut = summary_markdown(pretrain(steps=5569, max_steps=6000, stopped_by="max_minutes"))
    assert "Warning: pretrain.max_minutes stopped pretraining at step 5569 of 6000" in cut
    assert "Warning" not in summary_markdown(pretrain(steps=6000, max_steps=6000, stopped_by="max_steps"))
