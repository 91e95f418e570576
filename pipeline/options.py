"""Command-line options shared by `bertflow`'s command modules."""

from pathlib import Path
from typing import Annotated

import typer

ParamsOption = Annotated[Path, typer.Option("--params", "-p", help="The params file.", dir_okay=False)]
