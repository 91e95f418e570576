"""Beyond one machine: fits on a real Dask cluster (a LocalCluster of worker processes), task
branches at once, and what each stage holds (pipeline.placement)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.conftest import make_task_project, run_cli, small_params, write_params


def test_the_ledger_starts_a_stage_only_where_what_it_holds_is_free():
    from pipeline.placement import ALL, Ledger, Needs

    ledger = Ledger(cores=4, gpus=2, memory_gb=16)
    fits_here = Needs(ALL, 1, 6)
    assert ledger.resolve(fits_here) == Needs(4, 1, 6)  # every core of this machine
    assert ledger.take(Needs(1, 0, 2)) and ledger.take(Needs(1, 0, 2))
    assert not ledger.take(fits_here)  # two cores held: not all four free
    ledger.give(Needs(1, 0, 2))
    ledger.give(Needs(1, 0, 2))
    assert ledger.take(fits_here) and not ledger.take(Needs(1, 0, 1))
    ledger.give(fits_here)
    assert ledger.take(Needs(2, 2, 10)) and not ledger.take(Needs(1, 1, 1))  # no GPU left
    assert not ledger.take(Needs(1, 0, 8))  # 6 GB left
    ledger.give(Needs(2, 2, 10))
    # More than the machine has is cut to it: such a stage runs alone, never waits for ever.
    assert ledger.resolve(Needs(64, ALL, 512)) == Needs(4, 2, 16)
    assert Ledger(2, 0, 8).resolve(Needs(1, 1, 2)) == Needs(1, 0, 2)  # no GPU here: a core


def test_dry_run_says_what_each_stage_holds_and_where_its_fits_go(tmp_path):
    params = write_params(tmp_path, small_params(executor={"kind": "dask", "stages": 3,
                                                           "dask_address": "tcp://127.0.0.1:9"}))
    out = run_cli("bertflow", "run", "--dry-run", "-p", str(params), "--until", "finetune@trec-6-pretrained",
                  cwd=tmp_path).stdout
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines()[2:]}
    assert out.startswith("executor.stages: 3 at once")
    assert list(rows)[-2:] == ["task_data@trec-6", "finetune@trec-6-pretrained"]
    # Its fits go to the cluster: the stage holds one core here; each fit a core and a GPU there.
    assert rows["finetune@trec-6-pretrained"] == "stale 1 core, 1 GB 1 core, 1 GPU, 2 GB each, on tcp://127.0.0.1:9"
    assert "stale" in rows["pretrain"] and "8 GB" in rows["pretrain"]
    assert not (tmp_path / "data").exists() and not (tmp_path / "mlflow.db").exists()  # nothing ran


@pytest.mark.slow
def test_fits_on_a_dask_cluster_and_two_branches_at_once_record_what_a_local_run_does(tmp_path):
    from dask.distributed import LocalCluster
    from mlflow.tracking import MlflowClient

    repo = make_task_project(tmp_path / "project", {
        "reviews": {"kind": "classification", "source": "data/user/tasks/reviews.csv",
                    "columns": {"text": "review", "label": "verdict"}},
        "pairs": {"kind": "pair", "source": "data/user/tasks/pairs.jsonl"}},
        finetune={"seeds": [1, 2]})
    # Started first: a LocalCluster sets thread-count variables in this process (1), which both
    # runs then inherit, as the machine facts recorded with each fit say.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        run_cli("bertflow", "run", "--until", "finetune", cwd=repo)
        local = (repo / "dvc.lock").read_bytes()

        # The fits again, on a cluster of two worker processes, the two tasks' branches at once.
        shutil.rmtree(repo / "data" / "models" / "tasks")
        data = yaml.safe_load((repo / "params.yaml").read_text())
        data["executor"].update(kind="dask", dask_address=cluster.scheduler_address, stages=2)
        (repo / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        out = run_cli("bertflow", "run", "--until", "finetune", cwd=repo).stdout
    assert (repo / "dvc.lock").read_bytes() == local  # the same fits, recorded as a local run
    statuses = dict(line.split()[:2] for line in out.splitlines())
    assert {n: s for n, s in statuses.items() if s == "ran"} == {
        "finetune@reviews-pretrained": "ran", "finetune@pairs-pretrained": "ran"}
    fits = ["finetune@reviews-pretrained", "finetune@pairs-pretrained"]
    status = run_cli("dvc", "status", "--with-deps", *fits, cwd=repo).stdout
    assert "Data and pipelines are up to date" in status

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs(  # the latest of each name last
        [client.get_experiment_by_name("bertflow").experiment_id], order_by=["attributes.start_time ASC"])
        if r.info.run_name.startswith("finetune@") and r.data.tags["bertflow.status"] == "ran"}
    a, b = runs["finetune@reviews-pretrained"].info, runs["finetune@pairs-pretrained"].info
    assert max(a.start_time, b.start_time) < min(a.end_time, b.end_time)  # the branches overlapped
    for run in runs.values():
        assert run.data.tags["bertflow.this_run.cluster"] == cluster.scheduler_address
