"""`bertflow`: the command line. Light at import: heavy libraries load inside the commands."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from components.errors import BertflowError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Reproducible pretraining and fine-tuning of BERT-style encoders.")

ParamsOption = Annotated[Path, typer.Option("--params", "-p", help="The params file.",
                                            dir_okay=False)]


@app.command()
def run(
    params: ParamsOption = Path("params.yaml"),
    until: Annotated[str | None, typer.Option(help="Stop after this stage.")] = None,
) -> None:
    """Run the pipeline as a Prefect flow; DVC decides which stages are stale."""
    from components.config import load_params
    from pipeline.stages import stages_until

    stages_until(until)  # refuse a bad stage name or params file before Prefect starts
    load_params(params)
    from pipeline.flow import pipeline_flow

    results = pipeline_flow(str(params), until)
    for name, r in results.items():
        typer.echo(f"{name:10s} {r['status']:8s} {r['seconds']:7.1f} s")


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="Stage name, as in dvc.yaml.")],
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Run one stage (what dvc.yaml calls)."""
    from pipeline.stages import STAGES, run_stage

    if name not in STAGES:
        raise BertflowError(f"unknown stage {name!r} (stages: {', '.join(STAGES)})")
    run_stage(name, params)


def main() -> None:
    """Console entry point: bad params or data end in one clear line and exit code 1."""
    from pipeline import env

    env.configure()
    try:
        app()
    except BertflowError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(1)
    except OSError as e:  # disk full, permission denied, a path that is not there
        typer.echo(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), err=True)
        sys.exit(1)
    except Exception as e:
        if not type(e).__module__.startswith("pyarrow"):  # a corrupt Parquet file, say
            raise
        typer.echo(f"error: unreadable data: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
