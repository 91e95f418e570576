"""`bertflow`: the command line. Light at import: heavy libraries load inside the commands."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from components.core.errors import BertflowError
from components.core.params import load_params
from pipeline.cli_common import (
    Backend,
    BackendOption,
    ParamsOption,
    check_checkout,
    check_output,
    mlflow_client,
    registry_client,
)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Reproducible pretraining and fine-tuning of BERT-style encoders.")


@app.command()
def run(
    params: ParamsOption = Path("params.yaml"),
    until: Annotated[str | None, typer.Option(help="Stop after this stage.")] = None,
    task: Annotated[str | None, typer.Option(
        help="Only what this task needs, up to its evaluation, then register its model; the "
             "other tasks are left as they are.")] = None,
    wait: Annotated[bool, typer.Option(help="If another run is going on here, wait for it "
                                            "instead of refusing.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Say what would run, what each stage holds and where "
                                               "its fits go; run nothing.")] = False,
) -> None:
    """Run the pipeline as a Prefect flow; DVC decides which stages are stale."""
    from components.core.tracking import check_store
    from pipeline.ops.prefect_server import api_for_run
    from pipeline.pipelines import is_preset
    from pipeline.presets import owners
    from pipeline.stages import check_outputs_owned, plan

    if task and until:
        raise BertflowError("--task runs up to the task's evaluation: give --task or --until, not both")
    until = f"evaluate@{task}" if task else until
    p = load_params(params)
    # refuse bad params, a bad stage, a moved store or no API before Prefect starts
    check_outputs_owned(p, params.resolve().parent, plan(p, until))
    if is_preset(params):  # refused if it would write over its base's outputs
        owners(params, until)
    if dry_run:
        from pipeline.dry_run import dry_run as lines

        typer.echo("\n".join(lines(params, until)))
        return
    check_store(p.tracking, params.resolve().parent)
    check_checkout(params.resolve().parent)
    api_for_run()  # a configured API that does not answer, or a temporary one slow to start
    from pipeline.flow import pipeline_flow

    results = pipeline_flow(str(params), until, wait)
    width = max(map(len, results), default=10)
    for name, r in results.items():
        typer.echo(f"{name:{width}s} {r['status']:8s} {r['seconds']:7.1f} s")


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="Stage name as in dvc.yaml; per-task stages as STAGE@TASK.")],
    params: ParamsOption = Path("params.yaml"),
    wait: Annotated[bool, typer.Option(help="If a run or stage is going on here, wait for it "
                                            "instead of refusing.")] = False,
) -> None:
    """Run one stage (what dvc.yaml calls), under the project lock a run holds."""
    from pipeline import pipelines, presets
    from pipeline.ops.lock import project_lock
    from pipeline.ops.signals import ends_on_sigterm
    from pipeline.stages import check_outputs_owned, distributed_rank, run_stage, split_name

    split_name(name)  # a clear error for an unknown stage or a missing task
    root = params.resolve().parent
    p = load_params(params)
    # bad params, paths or folders that are not the stages' own: refused, nothing written
    check_outputs_owned(p, root, [name])
    if pipelines.is_preset(params):  # refused if it would write over its base's outputs
        presets.owners(params, name)
    check_checkout(root)
    if distributed_rank() != 0:  # another rank of a distributed run: it only computes
        run_stage(name, params, p=p)
        return
    # SIGTERM ends the stage as a failure: its MLflow run FAILED, its temp outputs removed, exit 143
    with project_lock(root, wait, what=f"bertflow stage {name}"), ends_on_sigterm():
        run_stage(name, params, p=p)


registry_app = typer.Typer(no_args_is_help=True, help="The MLflow model registry: a champion per task.")
app.add_typer(registry_app, name="registry")


@registry_app.command("list")
def registry_list(params: ParamsOption = Path("params.yaml")) -> None:
    """Every registered model: versions, champion (and its test metric), candidate, history."""
    from components.lifecycle.registry import listing

    rows = listing(mlflow_client(params))
    if not rows:
        typer.echo("the registry is empty: run `bertflow run` first")
        return
    typer.echo(f"{'model':24s} {'versions':>8s} {'champion':>8s} {'candidate':>9s}  metric")
    for r in rows:
        metric = f"{r['metric']} {float(r['value']):.4f}" if r["value"] else ""
        typer.echo(f"{r['name']:24s} {r['versions']:8d} {r['champion']:>8s} {r['candidate']:>9s}  "
                   f"{metric}  history {r['history']}")


@registry_app.command()
def promote(task: str, version: str, params: ParamsOption = Path("params.yaml")) -> None:
    """Make VERSION the champion of TASK (the previous one stays in the history)."""
    from components.lifecycle.registry import promote as do_promote

    do_promote(registry_client(params), task, version)
    typer.echo(f"{task}: version {version} is champion")


@registry_app.command()
def rollback(task: str, params: ParamsOption = Path("params.yaml")) -> None:
    """Give TASK's champion back to the previous champion."""
    from components.lifecycle.registry import rollback as do_rollback

    typer.echo(f"{task}: version {do_rollback(registry_client(params), task)} is champion again")


@registry_app.command()
def sync(params: ParamsOption = Path("params.yaml")) -> None:
    """Register the models this checkout holds (after `dvc pull` in a clone) with their lineage,
    as a run's registry step does; already registered ones (same content) are left as they are."""
    from pipeline.publish import sync as do_sync

    outcome, missing = do_sync(params)
    for name, r in outcome.items():
        champion = f", champion {r['champion']}" if r["champion"] else ""
        typer.echo(f"{name}: version {r['version']}{champion}: {r['reason']}")
    for task in missing:
        typer.echo(f"{task}: no evaluated model in this checkout (`dvc pull`, or `bertflow run`)")


tracking_app = typer.Typer(no_args_is_help=True, help="The project's own MLflow store (sqlite).")
app.add_typer(tracking_app, name="tracking")


@tracking_app.command()
def relocate(
    source: Annotated[Path | None, typer.Option("--from", help="The folder the project was copied or "
                                                "moved from.", show_default="found from the store")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Point a copied or moved project's mlflow.db at this folder's artifacts (it pins absolute
    paths); the old folder is neither read nor written."""
    from components.core import tracking

    params = params.resolve()
    done = tracking.relocate_store(load_params(params).tracking, params.parent, source)
    if not done:
        typer.echo(f"{params.parent}: the store's artifact locations are this folder's already")
    for old, counts in done.items():
        typer.echo(f"{old} -> {params.parent}: " + (", ".join(f"{n} {where}" for where, n in counts.items())
                                                   or "nothing held that folder"))


@app.command()
def lineage(
    ref: Annotated[str, typer.Argument(help="TASK@ALIAS (champion, candidate), TASK/VERSION, or "
                                            "TASK (its champion).")],
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Where a model version comes from: code, params, data versions, the encoder and its data."""
    from components.lifecycle.registry import lineage as chain

    typer.echo("\n".join(chain(registry_client(params), ref)))


@app.command()
def predict(
    task: Annotated[str, typer.Argument(help="The task (its registered model).")],
    text: Annotated[list[str] | None, typer.Option(help="Text to label (repeatable).")] = None,
    text_b: Annotated[list[str] | None, typer.Option(help="Second text of a pair task.")] = None,
    file: Annotated[Path | None, typer.Option(help="CSV or JSONL input, streamed.", exists=True,
                                              dir_okay=False)] = None,
    out: Annotated[Path | None, typer.Option(help="JSONL output (default: stdout).")] = None,
    model: Annotated[str | None, typer.Option(help="Model URI.",
                                              show_default="models:/TASK@champion")] = None,
    trust_model: Annotated[bool, typer.Option(help="Load a --model folder, or a model holding "
                                                   "pickles (loading runs their code).")] = False,
    batch_size: Annotated[int, typer.Option(help="Rows per model call.", min=1)] = 512,
    backend: BackendOption = Backend.torch,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Predict with a registered model: one JSON line per input, the input's fields included."""
    from pipeline.model_loading import fetched, load_pyfunc, model_uri
    from pipeline.predict import check_options, predict_rows

    limits = check_options(text, text_b, file, batch_size)
    if out is not None:
        check_output(out, "--out", params)
    uri = model_uri(task, model, trust_model, params)
    with fetched(uri, trust_model, "bertflow-predict-") as local:
        predict_rows(load_pyfunc(uri, local, backend.value), task, text, text_b, file, out, batch_size,
                     limits)


@app.command("export-hf")
def export_hf(
    task: Annotated[str, typer.Argument(help="The task (its registered model).")],
    out: Annotated[Path, typer.Argument(help="Folder to write (config.json, model.safetensors, tokenizer).")],
    ref: Annotated[str, typer.Option(help="ALIAS or VERSION of the task's model.")] = "champion",
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Write a registered classification, pair or token model in transformers' layout."""
    import tempfile

    import mlflow

    from components.lifecycle.hf_export import export_hf as convert
    from components.lifecycle.registry import version_uri

    check_output(out, "export-hf OUT", params, folder=True)
    uri = version_uri(registry_client(params), task, ref)
    with tempfile.TemporaryDirectory(prefix="bertflow-hf-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(uri, dst_path=tmp))
        info = convert(local / "artifacts" / "model", out, name=uri)
    typer.echo(f"{out}: {info['architecture']} with {info['labels']} labels "
               "(load with transformers' from_pretrained)")
    _exit_once_written()


def _exit_once_written() -> None:
    """End the `bertflow` process now, its output written. Python's own way out collects and
    frees the objects of the ~3,000 modules that torch, MLflow and pandas import, and writes
    nothing: 2-5 s on two busy cores, over 3 minutes seen on a busier machine. The atexit
    handlers run first, as on any exit. A caller of main() in its own process (a test) gets
    the return."""
    import atexit

    if Path(getattr(sys.modules.get("__main__"), "__file__", None) or "").name != "bertflow":
        return
    atexit._run_exitfuncs()  # logging's flush among them; then nothing else is left to do
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@app.command("serve-model")
def serve_model(
    task: Annotated[str, typer.Argument(help="The task (its registered model).")],
    model: Annotated[str | None, typer.Option(help="Model URI.",
                                              show_default="models:/TASK@champion")] = None,
    trust_model: Annotated[bool, typer.Option(help="Serve a --model folder, or a model holding "
                                                   "pickles (loading runs their code).")] = False,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 5000,
    workers: Annotated[int, typer.Option(help="Server processes.", min=1)] = 1,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body; a larger one gets 413.",
                                               min=0.001)] = 10.0,
    backend: BackendOption = Backend.torch,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Serve a registered model over REST until Ctrl-C or SIGTERM: MLflow's scoring server
    (POST /invocations, GET /ping), as `mlflow models serve` runs it, behind a request-body
    limit (MLflow's server alone reads any body whole into memory)."""
    from mlflow.pyfunc.scoring_server import _SERVER_MODEL_PATH

    from components.lifecycle.backends import BACKEND_ENV
    from pipeline.model_loading import check_backend_of, fetched, model_uri
    from pipeline.ops.body_limit import MAX_BODY_ENV
    from pipeline.ops.ui import check_port, run_until_stopped

    uri = model_uri(task, model, trust_model, params)
    check_port(host, port, uri)
    with fetched(uri, trust_model, "bertflow-serve-") as local:
        check_backend_of(uri, local, backend.value)
        env = {**os.environ, _SERVER_MODEL_PATH: str(local),
               MAX_BODY_ENV: str(int(max_body_mb * 1_000_000)), BACKEND_ENV: backend.value}
        typer.echo(f"serving {uri} on http://{host}:{port}/invocations (request bodies up to "
                   f"{max_body_mb:g} MB; Ctrl-C stops it)")
        code = run_until_stopped([sys.executable, "-m", "uvicorn", "--host", host, "--port", str(port),
                                  "--workers", str(workers), "pipeline.ops.scoring_app:app"], env)
    raise typer.Exit(code)


PrefectPortOption = Annotated[int, typer.Option(
    "--port", help="Port of the project's Prefect server (a free one if taken).", min=1, max=65535)]


@app.command()
def serve(
    params: ParamsOption = Path("params.yaml"),
    until: Annotated[str | None, typer.Option(help="Scheduled runs stop after this stage.")] = None,
    port: PrefectPortOption = 4200,
) -> None:
    """Serve the scheduled pipeline (params `schedule`) as a Prefect deployment; Ctrl-C stops.
    Without PREFECT_API_URL it runs on the project's own Prefect server (in .prefect/), started
    here and stopped on exit unless `bertflow server start` started it."""
    from components.core.tracking import check_store
    from pipeline.flow import scheduled_flow
    from pipeline.ops.schedule import serve as serve_schedule
    from pipeline.stages import plan

    p = load_params(params)
    plan(p, until)  # a bad stage fails now, not at the first scheduled run
    check_store(p.tracking, params.resolve().parent)  # not in every scheduled run
    serve_schedule(scheduled_flow, params, until, port)


server_app = typer.Typer(no_args_is_help=True, help="The project's own Prefect server (database in "
                         ".prefect/), on 127.0.0.1: its UI, and where `bertflow serve` schedules.")
app.add_typer(server_app, name="server")


@server_app.command("start")
def server_start(port: PrefectPortOption = 4200, params: ParamsOption = Path("params.yaml")) -> None:
    """Start the project's Prefect server in the background; it stays up until `server stop`."""
    from pipeline.ops import prefect_server

    root = params.resolve().parent
    if problem := prefect_server.scheduler_problem():
        typer.echo(f"warning: {problem}", err=True)
    server, started = prefect_server.start(root, port, say=typer.echo)
    typer.echo(f"Prefect UI: {server.url} ({'started' if started else 'already running'}, pid "
               f"{server.pid}{', stops with bertflow serve' if server.owner else ''})\n"
               f"`bertflow serve` uses it; for `bertflow run` too: export PREFECT_API_URL={server.api_url}")


@server_app.command("stop")
def server_stop(params: ParamsOption = Path("params.yaml")) -> None:
    """Stop the project's Prefect server (its database stays in .prefect/)."""
    from pipeline.ops import prefect_server

    root = params.resolve().parent
    owned = prefect_server.running(root)
    if owned and owned.owner is not None and prefect_server.is_alive(owned.owner):
        raise BertflowError(f"`bertflow serve` (pid {owned.owner}) runs this server; stop that "
                            "(Ctrl-C, or kill it) and the server stops with it")
    server = prefect_server.stop(root)
    typer.echo(f"stopped the Prefect server on port {server.port}" if server else
               "no Prefect server of this project is running")


@server_app.command("status")
def server_status(params: ParamsOption = Path("params.yaml")) -> None:
    """Whether the project's Prefect server runs, and where its UI is; exit code 1 if not."""
    from pipeline.ops import prefect_server

    server = prefect_server.running(params.resolve().parent)
    if server is None:
        typer.echo("not running (`bertflow server start` starts it)")
        raise typer.Exit(1)
    state = "running" if prefect_server.healthy(server.api_url) else "starting (not answering yet)"
    typer.echo(f"{state}: Prefect UI {server.url}, pid {server.pid}"
               f"{f', stops with bertflow serve (pid {server.owner})' if server.owner else ''}")


@app.command()
def report(
    out: Annotated[Path, typer.Option(help="The HTML file to write.")] = Path("report.html"),
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """One self-contained HTML report of the latest run: data stats per stage, pretraining
    curves, per-task metrics and plots, the transfer table, where each stage ran, the registry
    (works offline)."""
    from datetime import UTC, datetime

    from components.core.io import atomic_file
    from components.core.tracking import git_state, latest_stages
    from components.lifecycle.registry import listing
    from components.lifecycle.report import build_report
    from pipeline.drift import drift
    from pipeline.publish import params_sha256

    check_output(out, "--out", params)
    root, p = params.resolve().parent, load_params(params)
    header = {"project": str(root), "git commit": git_state(root).get("git.commit", "unknown"),
              "params sha256": params_sha256(p),
              "written": datetime.now(UTC).isoformat(timespec="seconds")}
    if lines := drift(root, root / p.paths.metrics):
        header["reference"] = " ".join(line.strip() for line in lines)
    page = build_report(root / p.paths.metrics, f"bertflow report: {root.name}",
                        listing(mlflow_client(params)), header, latest_stages(p.tracking, root))
    with atomic_file(out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    typer.echo(f"{out}: {len(page) / 1e6:.1f} MB, open it in any browser (no network needed)")


@app.command()
def metrics(params: ParamsOption = Path("params.yaml")) -> None:
    """A screen-wide summary of the run's stats: a few numbers per stage, then each task's
    pretrained and from-scratch scores (all of a stage's stats: metrics/*_stats.json); then
    which outputs differ from the committed reference, and which machine facts differ."""
    from components.lifecycle.summary import summary
    from pipeline.drift import drift

    p = load_params(params)
    root = params.resolve().parent
    typer.echo(summary(root / p.paths.metrics, list(p.finetune.tasks)), nl=False)
    for line in drift(root, root / p.paths.metrics):
        typer.echo(line)


@app.command()
def compare(
    runs: Annotated[list[str], typer.Argument(help="LABEL=PATH of each run's transfer.json, e.g. "
                                                   "mini=metrics/transfer.json.")],
) -> None:
    """Print several runs' transfer tables as one Markdown table: a column per run and init."""
    from components.core.io import read_json
    from components.evaluation.tables import compare_transfer

    tables = {}
    for item in runs:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path).is_file():
            raise BertflowError(f"{item}: expected LABEL=PATH of an existing transfer.json")
        tables[label] = read_json(Path(path))
    typer.echo(compare_transfer(tables), nl=False)


@app.command()
def probe(
    encoder: Annotated[Path | None, typer.Argument(help="An encoder folder (default: the pretrain "
                                                        "stage's).")] = None,
    seeds: Annotated[list[int] | None, typer.Option("--seed", help="A seed (repeat the option for "
                                                                   "more; default 1).")] = None,
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Score an encoder in a few minutes on validation splits (trec-6, movie-sentiment,
    conll2003-ner, news-order samples), to choose a pretraining recipe by what it buys."""
    import json
    import tempfile

    from components.training.probe import probe as run_probe

    p = load_params(params)
    root = params.resolve().parent
    encoder = encoder or root / p.paths.models / "encoder"
    with tempfile.TemporaryDirectory(prefix="bertflow-probe-") as work:
        scores = run_probe(encoder, p.finetune.tasks, p.finetune, root / p.paths.tasks, Path(work), seeds)
    typer.echo(json.dumps(scores, indent=2))


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="The port.", min=1, max=65535)] = 5000,
    host: Annotated[str, typer.Option(help="The interface (loopback: this machine only).")] = "127.0.0.1",
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """The MLflow UI on the project's runs and registry (and how to start Prefect's); Ctrl-C stops it."""
    from pipeline.ops.ui import serve_ui

    sys.exit(serve_ui(params, host, port))


def _register_explore_commands() -> None:
    from pipeline.cli_explore import COMMANDS

    for name, command in COMMANDS.items():
        app.command(name)(command)


_register_explore_commands()


def main() -> None:
    """Console entry point: bad params or data end in one clear line and exit code 1; anything
    else in its traceback. Secrets are masked in both, as in every log line."""
    import traceback

    from components.core.redact import redact
    from pipeline.ops import env
    from pipeline.ops.redaction import install_stream_redaction
    from pipeline.ops.signals import Terminated

    env.configure()
    install_stream_redaction()  # the libraries' own prints too

    def fail(message: str, code: int = 1) -> None:
        typer.echo(redact(message), err=True)
        sys.exit(code)

    try:
        app()
    except Terminated as e:  # a stage or run SIGTERM ended
        fail(f"error: {e}", e.code)
    except BertflowError as e:
        fail(f"error: {e}")
    except OSError as e:  # disk full, permission denied, a path that is not there
        fail(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "))
    except Exception as e:
        if type(e).__module__.startswith("pyarrow"):  # a corrupt Parquet file, say
            fail(f"error: unreadable data: {e}")
        fail("".join(traceback.format_exception(e)).rstrip())  # a bug, or a service failing


if __name__ == "__main__":
    main()
