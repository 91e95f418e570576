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
    from pipeline.stages import plan

    plan(load_params(params), until)  # refuse bad params or a bad stage before Prefect starts
    from pipeline.flow import pipeline_flow

    results = pipeline_flow(str(params), until)
    width = max(map(len, results), default=10)
    for name, r in results.items():
        typer.echo(f"{name:{width}s} {r['status']:8s} {r['seconds']:7.1f} s")


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="Stage name as in dvc.yaml; per-task stages as STAGE@TASK.")],
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Run one stage (what dvc.yaml calls)."""
    from pipeline.stages import run_stage, split_name

    split_name(name)  # a clear error for an unknown stage or a missing task
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
