"""The model lifecycle on a small real project: the registry with champion/challenger and
lineage, the pyfunc model on raw text, `bertflow predict`, REST serving with `mlflow models
serve`, the transformers export, the DVC push/pull round trip, a scheduled run triggered
through a Prefect server, and a project that travels:

- copied: the copy's commands refuse its mlflow.db (which names the old folder) in one line,
  `bertflow tracking relocate` points it at the copy, and then the copy predicts and writes
  artifacts of its own while the original's files stay as they were;
- cloned: committed (dvc.lock, metrics) and pushed, a `git clone` with `dvc pull` and
  `bertflow registry sync` has the original's committed models as champions (by content hash)
  and predicts as they do.

The tests share one project and run in file order; each holds whatever ran before it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, make_task_project, run_cli
from tests.test_relocate import snapshot

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
TASKS = {
    "reviews": {"kind": "classification", "source": "data/user/tasks/reviews.csv",
                "columns": {"text": "review", "label": "verdict"}},
    # A learning-rate search: a rate too small to learn this in 8 epochs, and the project's.
    "same-topic": {"kind": "pair", "source": "data/user/tasks/pairs.jsonl", "lr": [1e-6, 0.003]},
    "ner": {"kind": "token", "source": "data/user/tasks/ner.conll"},
    "ner-span": {"kind": "span", "source": "data/user/tasks/ner.conll", "max_span_words": 3,
                 "span_decoding": "greedy", "epochs": 16},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A DVC project with one task of each kind, run once by `bertflow run` (tiny model)."""
    repo = make_task_project(tmp_path_factory.mktemp("lifecycle") / "project", TASKS,
                             finetune={"onnx": ["pretrained"]})
    run_cli("bertflow", "run", cwd=repo)
    return repo


def _commit(repo: Path, message: str) -> None:
    run_cli("git", "add", "-A", cwd=repo)
    run_cli("git", "commit", "-qm", message, cwd=repo)


def _client(repo: Path):
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{repo / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(uri)


def _lock(repo: Path, stage: str, path: str) -> str:
    entry = yaml.safe_load((repo / "dvc.lock").read_text())["stages"][stage]
    return next(d["md5"] for d in entry["deps"] + entry["outs"] if d["path"] == path)


def _statuses(out: str) -> dict[str, str]:
    return {line.split()[0]: line.split()[1] for line in out.splitlines()
            if len(line.split()) >= 2 and line.split()[1] in ("ran", "skipped")}


def test_a_run_registers_a_champion_per_task_that_answers_raw_text(project):
    import mlflow
    import pandas as pd

    # The default block: ModernBERT's, exported as transformers' ModernBert.
    encoder = json.loads((project / "data/models/encoder/config.json").read_text())
    assert encoder["model_type"] == "modernbert"
    client = _client(project)
    for task in TASKS:
        champion = client.get_model_version_by_alias(task, "champion")
        assert client.get_model_version_by_alias(task, "candidate").version == champion.version
        assert champion.tags["bertflow.metric_name"] == ("accuracy" if TASKS[task]["kind"] in
                                                         ("classification", "pair") else "entity_f1")
        # Lineage: the data versions are dvc.lock's, and the encoder version is the one it started from.
        data = f"data/tasks/{task}"
        assert champion.tags[f"dvc.{data}"] == _lock(project, f"finetune@{task}-pretrained", data)
        encoder = client.get_model_version("encoder", champion.tags["bertflow.encoder_version"])
        assert encoder.tags["dvc.data/models/encoder"] == champion.tags["dvc.data/models/encoder"]
        assert encoder.tags["dvc.data/pairs"] == _lock(project, "pretrain", "data/pairs")
        assert champion.tags["git.commit"] == run_cli("git", "rev-parse", "HEAD", cwd=project).stdout.strip()
        # Code, not pickle: the model is its source file plus safetensors and JSON artifacts.
        local = Path(mlflow.artifacts.download_artifacts(f"models:/{task}@champion"))
        assert not [p for p in local.rglob("*") if p.suffix in (".pkl", ".pickle", ".cloudpickle")]
        assert "model_code_path" in (local / "MLmodel").read_text()

    def load(task):
        return mlflow.pyfunc.load_model(f"models:/{task}@champion")

    # The user files are learnable by construction (see tests/test_finetune.py).
    reviews = load("reviews").predict(pd.DataFrame({"text": ["the film number 7 was great",
                                                             "the film number 8 was awful"]}))
    assert [r["label"] for r in reviews] == ["pos", "neg"] and all(0.5 < r["score"] <= 1 for r in reviews)
    same = load("same-topic").predict(pd.DataFrame({
        "text_a": ["the president spoke about taxes 3", "the president spoke about taxes 4"],
        "text_b": ["the president spoke about taxes 3", "a storm hit the coast 4"]}))
    assert [r["label"] for r in same] == ["same", "other"]
    text = "Jones visited Boston in 1950"
    ner = load("ner").predict(pd.DataFrame({"text": [text]}))[0]
    assert ner["tokens"] == text.split() and ner["tags"] == ["B-PER", "O", "B-LOC", "O", "O"]
    assert [(e["text"], e["label"]) for e in ner["entities"]] == [("Jones", "PER"), ("Boston", "LOC")]
    spans = load("ner-span").predict(pd.DataFrame({"tokens": [text.split()]}))[0]["spans"]
    assert [(s["start"], s["end"], s["label"]) for s in spans] == [(0, 1, "PER"), (2, 3, "LOC")]
    assert [text[s["start_char"]:s["end_char"]] for s in spans] == ["Jones", "Boston"]

    chain = run_cli("bertflow", "lineage", "ner@champion", cwd=project).stdout
    assert _lock(project, "pretrain", "data/pairs") in chain
    assert _lock(project, "finetune@ner-pretrained", "data/tasks/ner") in chain
    assert "<- encoder version" in chain


def test_the_learning_rate_is_chosen_on_validation_and_every_trial_is_a_child_run(project):
    stats = json.loads((project / "metrics" / "tasks" / "same-topic" / "finetune-pretrained_stats.json")
                       .read_text())
    search = stats["search"]
    assert search["lr"] == 0.003 and set(search["trials"]) == {"1e-06", "0.003"}
    assert search["trials"]["0.003"]["best_val_metric"] > search["trials"]["1e-06"]["best_val_metric"]
    # The winning trial is the first seed's fit: no second training, the same validation record.
    (fit,) = stats["fits"].values()
    assert fit == {"lr": 0.003, **search["trials"]["0.003"]}
    fits = project / "data/models/tasks/same-topic/pretrained/fits"
    assert sorted(p.name for p in fits.iterdir()) == \
        ["pretrained-s1.json", "pretrained-s1.parquet", "pretrained-search.json"]  # no losing trial's
    assert json.loads((fits / "pretrained-search.json").read_text()) == search  # kept with the fits

    client = _client(project)
    (stage,) = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id],
                                  "attributes.run_name = 'finetune@same-topic-pretrained'")
    trials = client.search_runs([stage.info.experiment_id],
                                f"tags.`mlflow.parentRunId` = '{stage.info.run_id}'")
    assert {(t.data.params["lr"], t.data.tags["bertflow.lr_chosen"]) for t in trials} == \
        {("1e-06", "False"), ("0.003", "True")}
    assert all(t.data.metrics["best_val_metric"] >= 0 and t.data.metrics["minutes"] > 0 for t in trials)
    table = (project / "metrics" / "transfer.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| same-topic |"))
    assert row.count("| 0.003 |") == 1


def test_nothing_changed_registers_nothing_and_a_worse_model_stays_candidate(project):
    client = _client(project)
    versions = {t: len(client.search_model_versions(f"name='{t}'")) for t in [*TASKS, "encoder"]}
    out = run_cli("bertflow", "run", cwd=project).stdout
    assert set(_statuses(out).values()) == {"skipped"}
    assert versions == {t: len(client.search_model_versions(f"name='{t}'")) for t in versions}

    # Fewer examples and one epoch: a worse reviews model. It is registered, but stays candidate.
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["finetune"]["tasks"]["reviews"].update(max_train_examples=8, epochs=1)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _commit(project, "a worse reviews model")
    ran = [n for n, s in _statuses(run_cli("bertflow", "run", cwd=project).stdout).items() if s == "ran"]
    # Only the stages of the starts in finetune.init exist (here pretrained alone).
    assert ran == ["task_data@reviews", "finetune@reviews-pretrained", "evaluate@reviews", "transfer",
                   "registry"]
    champion = client.get_model_version_by_alias("reviews", "champion")
    candidate = client.get_model_version_by_alias("reviews", "candidate")
    assert (str(champion.version), str(candidate.version)) == ("1", "2")
    assert float(candidate.tags["bertflow.metric"]) <= float(champion.tags["bertflow.metric"])

    listing = run_cli("bertflow", "registry", "list", cwd=project).stdout
    assert any(line.split()[:4] == ["reviews", "2", "1", "2"] for line in listing.splitlines())
    run_cli("bertflow", "registry", "promote", "reviews", "2", cwd=project)
    assert str(client.get_model_version_by_alias("reviews", "champion").version) == "2"
    assert "version 1 is champion again" in run_cli("bertflow", "registry", "rollback", "reviews",
                                                    cwd=project).stdout
    assert str(client.get_model_version_by_alias("reviews", "champion").version) == "1"
    rolled = client.get_model_version("reviews", "2").tags
    assert "bertflow.promoted_at" in rolled and "bertflow.rolled_back_at" in rolled
    # Nothing left to roll back to: a clear error, exit 1.
    refused = run_cli("bertflow", "registry", "rollback", "reviews", cwd=project, check=False)
    assert refused.returncode == 1 and "no previous champion" in refused.stderr


def test_predict_streams_a_file_of_three_thousand_lines(project, tmp_path, monkeypatch):
    import mlflow
    import pandas as pd

    from components.lifecycle.rows import read_batches

    # Lines like the training file's: an even number is reviewed with a positive word. (Which
    # cue wins when the two disagree is asked of the champion in the first test.)
    positive, negative = ["good", "great", "fine"], ["bad", "awful", "poor"]
    rows = [{"text": f"the film number {i % 240} was {(negative if i % 2 else positive)[i // 240 % 3]}"}
            for i in range(3_000)]
    lines = [json.dumps(row) for row in rows]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    assert [len(b) for b in read_batches(tmp_path / "in.jsonl", 1024)] == [1024, 1024, 952]
    run_cli("bertflow", "predict", "reviews", "--file", str(tmp_path / "in.jsonl"), "--out",
            str(tmp_path / "out.jsonl"), "--batch-size", "1000", cwd=project)
    answers = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    # In input order, each the answer of the whole table at once.
    _client(project)
    monkeypatch.setenv("BERTFLOW_MAX_ROWS", "3000")  # the whole file in one call
    whole = mlflow.pyfunc.load_model("models:/reviews@champion").predict(pd.DataFrame(rows))
    assert [a["text"] for a in answers] == [r["text"] for r in rows]
    assert [a["label"] for a in answers] == [w["label"] for w in whole]
    assert sum(a["label"] == ("neg" if i % 2 else "pos") for i, a in enumerate(answers)) >= 2_850
    # The same file on the model's ONNX graph (finetune.onnx) in ONNX Runtime: the same answers.
    run_cli("bertflow", "predict", "reviews", "--file", str(tmp_path / "in.jsonl"), "--out",
            str(tmp_path / "onnx.jsonl"), "--batch-size", "1000", "--backend", "onnx", cwd=project)
    onnx = [json.loads(line) for line in (tmp_path / "onnx.jsonl").read_text().splitlines()]
    assert [a["label"] for a in onnx] == [a["label"] for a in answers]
    assert [a["score"] for a in onnx] == pytest.approx([a["score"] for a in answers], abs=1e-5)

    # A bad line: the error names it, and no output file is left behind.
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n{oops\n")
    failed = run_cli("bertflow", "predict", "reviews", "--file", str(tmp_path / "bad.jsonl"), "--out",
                     str(tmp_path / "bad-out.jsonl"), cwd=project, check=False)
    assert failed.returncode == 1 and "bad.jsonl, line 2" in failed.stderr
    assert not list(tmp_path.glob("*bad-out*"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], cwd: Path, env: dict, url: str, log: Path) -> subprocess.Popen:
    """Start a server in its own process group; wait until `url` answers."""
    import httpx

    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{cmd[0]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    _stop(proc)
    raise AssertionError(f"{url} did not answer:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop the whole process group (mlflow leaves its workers behind otherwise)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def _env(**extra: str) -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **extra}


def serve_champion(repo: Path, task: str, log: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow models serve` of the task's champion from the project's store, answering; the
    server (stop it with _stop) and its /invocations URL."""
    port = _free_port()
    server = _start(["mlflow", "models", "serve", "-m", f"models:/{task}@champion", "--env-manager",
                     "local", "-h", "127.0.0.1", "-p", str(port)], repo,
                    _env(MLFLOW_TRACKING_URI=f"sqlite:///{repo / 'mlflow.db'}"),
                    f"http://127.0.0.1:{port}/ping", log)
    return server, f"http://127.0.0.1:{port}/invocations"


def test_rest_serving_answers_as_predict_does_and_bad_requests_get_400(project, tmp_path):
    import httpx

    texts = ["the film number 11 was great", "the film number 12 was awful", "a film"]
    args = [a for t in texts for a in ("--text", t)]
    offline = [json.loads(line) for line in
               run_cli("bertflow", "predict", "reviews", *args, cwd=project).stdout.splitlines()]
    server, url = serve_champion(project, "reviews", tmp_path / "serve.log")
    try:
        served = httpx.post(url, json={"dataframe_records": [{"text": t} for t in texts]}, timeout=60)
        assert served.status_code == 200
        for got, want in zip(served.json()["predictions"], offline, strict=True):
            assert got["label"] == want["label"] and got["score"] == pytest.approx(want["score"], abs=1e-6)
        for bad in ({"dataframe_records": [{"review": "no text column"}]},
                    {"dataframe_records": [{"text": None}]}, {"instances": "not a table"}):
            answer = httpx.post(url, json=bad, timeout=60)
            assert answer.status_code == 400 and answer.json()["message"], (bad, answer.text)
        garbled = httpx.post(url, content=b"{not json", headers={"Content-Type": "application/json"})
        assert garbled.status_code == 400
    finally:
        _stop(server)


def test_transformers_loads_the_export_and_predicts_the_same(project, tmp_path):
    import mlflow
    import pandas as pd
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    _client(project)
    run_cli("bertflow", "export-hf", "reviews", str(tmp_path / "reviews"), cwd=project)
    texts = ["the film number 21 was great", "the film number 22 was poor", "fine"]
    ours = mlflow.pyfunc.load_model("models:/reviews@champion").predict(pd.DataFrame({"text": texts}))
    theirs = pipeline("text-classification", model=str(tmp_path / "reviews"))(texts)
    assert [t["label"] for t in theirs] == [o["label"] for o in ours]
    assert [t["score"] for t in theirs] == pytest.approx([o["score"] for o in ours], abs=1e-4)

    run_cli("bertflow", "export-hf", "ner", str(tmp_path / "ner"), cwd=project)
    words = "Smith visited London in 1911".split()
    tok = AutoTokenizer.from_pretrained(tmp_path / "ner")
    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "ner").eval()
    enc = tok([words], is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        best = model(**enc).logits.argmax(-1)[0]
    first = [enc.word_ids(0).index(i) for i in range(len(words))]
    ours = mlflow.pyfunc.load_model("models:/ner@champion").predict(pd.DataFrame({"tokens": [words]}))
    assert [model.config.id2label[int(best[i])] for i in first] == ours[0]["tags"]

    refused = run_cli("bertflow", "export-hf", "ner-span", str(tmp_path / "span"), cwd=project, check=False)
    assert refused.returncode == 1 and "no transformers equivalent" in refused.stderr
    assert not (tmp_path / "span").exists()


def test_dvc_push_then_pull_in_a_fresh_clone_recomputes_nothing(project, tmp_path):
    _commit(project, "results")
    run_cli("dvc", "push", cwd=project)
    clone = tmp_path / "clone"
    run_cli("git", "clone", "-q", str(project), str(clone), cwd=tmp_path)
    # The default remote is a folder inside each checkout: point the clone at the project's.
    run_cli("dvc", "remote", "modify", "--local", "local", "url", str(project / ".dvc-storage"), cwd=clone)
    run_cli("dvc", "pull", cwd=clone)
    assert "up to date" in run_cli("dvc", "status", cwd=clone).stdout
    for path in ("data/models/tasks/ner/pretrained/model/model.safetensors",
                 "data/models/encoder/model.safetensors"):
        assert (clone / path).read_bytes() == (project / path).read_bytes()
    statuses = _statuses(run_cli("bertflow", "run", cwd=clone).stdout)
    assert {s for n, s in statuses.items() if n != "registry"} == {"skipped"}


def _api_post(url: str) -> dict:
    """POST to the Prefect API; a busy server (a 5xx while its SQLite is locked) is asked again."""
    import httpx

    for _ in range(10):
        answer = httpx.post(url, json={}, timeout=30)
        if answer.status_code < 500:
            break
        time.sleep(2)
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_a_scheduled_run_triggered_through_a_prefect_server(project, prefect_api, tmp_path):
    import httpx

    api = prefect_api  # a real `prefect server start`, the API `bertflow serve` is given
    env = _env(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=api)
    # What the scheduled run should pick up: a changed NER setting.
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["finetune"]["tasks"]["ner"]["epochs"] = 6
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _commit(project, "ner: 6 epochs")
    pushed_before = sum(1 for p in (project / ".dvc-storage").rglob("*") if p.is_file())
    client = _client(project)
    before = {t: len(client.search_model_versions(f"name='{t}'")) for t in TASKS}
    serving = None
    try:
        serving = subprocess.Popen(["bertflow", "serve"], cwd=project, env=env, start_new_session=True,
                                   stdout=(tmp_path / "serve.log").open("w"), stderr=subprocess.STDOUT)
        deployment = None
        for _ in range(120):
            found = httpx.get(f"{api}/deployments/name/bertflow-scheduled/bertflow-nightly", timeout=5)
            if found.status_code == 200:
                deployment = found.json()
                break
            time.sleep(1)
        assert deployment, (tmp_path / "serve.log").read_text()[-3000:]
        assert deployment["schedules"][0]["schedule"]["cron"] == "0 3 * * *"
        run = _api_post(f"{api}/deployments/{deployment['id']}/create_flow_run")
        state = None
        for _ in range(600):
            state = httpx.get(f"{api}/flow_runs/{run['id']}", timeout=5).json()["state"]["type"]
            if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                break
            time.sleep(1)
        assert state == "COMPLETED", (tmp_path / "serve.log").read_text()[-5000:]
    finally:
        if serving is not None:
            _stop(serving)
    after = {t: len(client.search_model_versions(f"name='{t}'")) for t in TASKS}
    assert after == {**before, "ner": before["ner"] + 1}  # only the changed task is new
    assert str(client.get_model_version_by_alias("ner", "candidate").version) == str(after["ner"])
    assert "up to date" in run_cli("dvc", "status", cwd=project).stdout
    assert sum(1 for p in (project / ".dvc-storage").rglob("*") if p.is_file()) > pushed_before


def test_fill_mask_embed_and_attention_default_to_the_registered_encoder(project, tmp_path):
    cloze = "the president spoke about [MASK] ."
    registered = run_cli("bertflow", "fill-mask", cloze, cwd=project).stdout
    local = run_cli("bertflow", "fill-mask", cloze, "--model", "data/models/encoder", cwd=project).stdout
    assert registered == local and len(registered.split()) == 10
    run_cli("bertflow", "attention", "the president spoke", "--out", str(tmp_path / "a.png"), cwd=project)
    assert (tmp_path / "a.png").stat().st_size > 1000
    run_cli("bertflow", "embed", "--text", "a film", "--out", str(tmp_path / "e.npy"), cwd=project)
    assert (tmp_path / "e.npy").stat().st_size > 0


def test_the_report_holds_every_stage_task_and_model_and_needs_no_network(project, tmp_path):
    import re

    run_cli("bertflow", "report", "--out", str(tmp_path / "report.html"), cwd=project)
    page = (tmp_path / "report.html").read_text()
    assert not re.search(r"<script|<link|(src|href)=\"(https?:)?//", page)  # self-contained
    for stage in ("ingest", "clean", "tokenizer", "pairs"):
        stats = json.loads((project / "metrics" / f"{stage}_stats.json").read_text())
        assert f"<h3>{stage}</h3>" in page
    assert f"{stats['train']['instances']:,}" in page  # the pairs stage's own numbers
    pretrain = json.loads((project / "metrics" / "pretrain_stats.json").read_text())
    assert f"{pretrain['mlm_accuracy']:.4g}" in page
    for task in TASKS:
        evaluate = json.loads((project / "metrics" / "tasks" / task / "evaluate_stats.json").read_text())
        scores = evaluate["fits"]["pretrained-s1"]
        assert f"<h3>{task}</h3>" in page and f"{scores[evaluate['metric']]:.4g}" in page
        assert f"<td>{task}</td>" in page  # in the transfer table and the registry table
    transfer = json.loads((project / "metrics" / "transfer.json").read_text())
    cost = page.split("What each start cost")[1]
    assert all(f"<td>{transfer[task]['steps']['pretrained']['mean']:,.0f} ± " in cost for task in TASKS)
    images = re.findall(r'src="data:image/png;base64,', page)
    assert len(images) >= 1 + len(TASKS)  # the pretraining curve, at least a plot per task
    ran = page.split("Where the latest run's stages ran")[1].split("<h2>")[0]  # each on this host
    assert all(f"<td>finetune@{task}-pretrained</td>" in ran for task in TASKS)
    assert f"<td>{socket.gethostname()}</td>" in ran and f"<td>local: {socket.gethostname()}</td>" in ran


# A project that travels --------------------------------------------------------------------------

TEXTS = ["the film number 7 was great", "the film number 8 was awful", "a film"]


def _predict(repo: Path, model: str | None = None) -> str:
    texts = [a for t in TEXTS for a in ("--text", t)]
    return run_cli("bertflow", "predict", "reviews", *texts, *(["--model", model] if model else []),
                   cwd=repo).stdout


def _checkout_versions(repo: Path) -> dict[str, str]:
    """Per model (the encoder, reviews): the version of `repo`'s registry that holds the model its
    checkout holds, found by content hash. After earlier tests that is not always the champion
    (a worse model registered as candidate, a rollback), and only the checkout's model travels."""
    from components.core.params import load_params
    from components.lifecycle import registry

    models = repo / load_params(repo / "params.yaml").paths.models
    client = _client(repo)
    out = {}
    for name, folder in (("encoder", models / "encoder"),
                         ("reviews", models / "tasks/reviews/pretrained/model")):
        sha = registry.model_sha256(folder)
        (version,) = [v.version for v in client.search_model_versions(f"name='{name}'")
                      if v.tags.get(registry.SHA) == sha]
        out[name] = str(version)
    return out


def _registered(repo: Path, versions: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Per model: the content hash and the DVC lineage of a version: `versions`', or by default
    the champion (the encoder: its latest version, which is not challenged)."""
    from components.core import tracking
    from components.core.params import load_params
    from components.lifecycle import registry

    client = tracking.client(load_params(repo / "params.yaml").tracking, repo)
    out = {}
    for name, alias in (("encoder", registry.CANDIDATE), ("reviews", registry.CHAMPION)):
        found = client.get_model_version(name, versions[name]) if versions else \
            client.get_model_version_by_alias(name, alias)
        out[name] = {k: v for k, v in found.tags.items() if k == registry.SHA or k.startswith("dvc.")}
    return out


def test_a_copy_refuses_the_old_store_until_relocated_and_then_uses_only_its_own(project, tmp_path):
    # The original as it is now (earlier tests may have registered, promoted and rolled back).
    answers = _predict(project)
    client = _client(project)
    row = ["reviews", str(len(client.search_model_versions("name='reviews'"))),
           str(client.get_model_version_by_alias("reviews", "champion").version)]
    before = {name: snapshot(project / name) for name in ("mlartifacts", "data")}
    db_before = snapshot(project)["mlflow.db"]
    copy = tmp_path / "copy"
    shutil.copytree(project, copy, symlinks=True)

    for command in (["registry", "list"], ["predict", "reviews", "--text", TEXTS[0]]):
        refused = run_cli("bertflow", *command, cwd=copy, check=False)
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert (project / "mlartifacts").as_uri() in refused.stderr
        assert "bertflow tracking relocate" in refused.stderr

    moved = run_cli("bertflow", "tracking", "relocate", cwd=copy).stdout
    assert moved.startswith(f"{project} -> {copy}: ") and "model_versions.source" in moved
    assert _predict(copy) == answers
    listing = run_cli("bertflow", "registry", "list", cwd=copy).stdout
    assert any(line.split()[:3] == row for line in listing.splitlines()), (row, listing)
    # A stage logs its artifacts into the copy's folder.
    artifacts = set((copy / "mlartifacts").iterdir())
    run_cli("bertflow", "stage", "transfer", cwd=copy)
    (new_run,) = set((copy / "mlartifacts").iterdir()) - artifacts
    assert any(p.is_file() for p in new_run.rglob("transfer.md"))

    assert {name: snapshot(project / name) for name in before} == before
    assert snapshot(project)["mlflow.db"] == db_before


def test_a_clone_with_dvc_pull_and_registry_sync_has_the_same_champions_and_predictions(project, tmp_path):
    # What a user commits after `make run`: dvc.lock (the data versions a clone pulls) and
    # metrics/ (stats files DVC keeps in git, not in the remote); an earlier test may have
    # committed them already.
    run_cli("git", "add", "dvc.lock", "metrics", cwd=project)
    if run_cli("git", "diff", "--cached", "--quiet", cwd=project, check=False).returncode:
        run_cli("git", "commit", "-qm", "results", cwd=project)
    run_cli("dvc", "push", cwd=project)
    clone = tmp_path / "clone"
    run_cli("git", "clone", "-q", str(project), str(clone), cwd=tmp_path)
    run_cli("dvc", "remote", "modify", "--local", "local", "url", str(project / ".dvc-storage"), cwd=clone)
    run_cli("dvc", "pull", cwd=clone)

    synced = run_cli("bertflow", "registry", "sync", cwd=clone).stdout
    assert "encoder: version 1" in synced, synced
    for task in TASKS:
        assert f"{task}: version 1, champion 1: first champion" in synced, synced
    # The clone's champions are the original's committed models (its champions after a plain
    # run; a champion that is not the committed model does not travel, see docs/lifecycle.md).
    committed = _checkout_versions(project)
    assert _registered(clone) == _registered(project, committed)
    assert _predict(clone) == _predict(project, f"models:/reviews/{committed['reviews']}")

    # A model folder that is not dvc.lock's would get dvc.lock's lineage: refused, by name.
    with (clone / "data/models/tasks/reviews/pretrained/model/bertflow.json").open("a") as f:
        f.write(" ")
    refused = run_cli("bertflow", "registry", "sync", cwd=clone, check=False)
    assert refused.returncode == 1 and \
        "data/models/tasks/reviews/pretrained: differs from dvc.lock" in refused.stderr
    run_cli("dvc", "checkout", "--force", cwd=clone)
    # Idempotent: a second sync registers nothing (versions are found by content hash).
    again = run_cli("bertflow", "registry", "sync", cwd=clone).stdout
    assert again.splitlines() == ["encoder: version 1: unchanged: version 1 holds this model"] + \
        [f"{task}: version 1, champion 1: unchanged: version 1 holds this model" for task in TASKS]
