"""Which model `bertflow predict` and `serve-model` load, whether they may, and loading it.

Loading an MLflow model runs the code it holds (its models-from-code file, a loader module, a
pickle). The project's registry holds bertflow's own code and safetensors; a model folder, or a
model holding pickles, is loaded only with --trust-model.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from components.core.errors import BertflowError
from pipeline.cli_common import mlflow_client, registry_client


def model_uri(task: str, model: str | None, trust_model: bool, params: Path) -> str:
    """The model a command loads: `model`, else TASK's champion; a registry URI checked
    against the registry, a model folder refused unless trusted."""
    from components.lifecycle.registry import checked_uri

    uri = model or f"models:/{task}@champion"
    if model and not trust_model:
        _check_model_folder(model, params.resolve().parent)
    return checked_uri(registry_client(params) if uri.startswith("models:/") else mlflow_client(params), uri)


@contextlib.contextmanager
def fetched(uri: str, trust_model: bool, prefix: str) -> Iterator[Path]:
    """The model at `uri`, checked (_fetch_model), in a temporary folder for the block."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield _fetch_model(uri, Path(tmp), trust_model)


def _fetch_model(uri: str, dst: Path, trust_model: bool) -> Path:
    """The model at `uri`, downloaded into `dst` (or the folder itself), checked for pickles:
    MLflow would unpickle them on loading, which runs whatever their author put in. A model
    bertflow saved is code and safetensors; anything else needs --trust-model."""
    import mlflow

    from components.lifecycle.registry import pickles_in

    # MLflow's own switch too (it allows pickles by default), for this process and a server's.
    os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = str(trust_model).lower()
    local = Path(uri) if Path(uri).is_dir() else \
        Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(dst)))
    if not trust_model and (found := pickles_in(local)):
        raise BertflowError(f"model {uri} holds what loading would unpickle ({', '.join(found[:3])}"
                            f"{', ...' if len(found) > 3 else ''}), which can run any code; pass "
                            "--trust-model if you trust who wrote it")
    return local


def _check_model_folder(uri: str, root: Path) -> None:
    """Refuse a model folder, inside the project or outside: loading an MLflow model runs the
    code it holds (its models-from-code file, a loader module, a pickle), whoever put it
    there. Registry and run URIs resolve through the project's tracking store (params
    `tracking`), where the registry step logged bertflow's own code; _fetch_model checks them."""
    from urllib.parse import urlparse

    from components.lifecycle.registry import code_in

    parsed = urlparse(uri)
    if parsed.scheme in ("models", "runs", "mlflow-artifacts"):
        return
    folder = Path(parsed.path if parsed.scheme else uri)
    if parsed.scheme not in ("", "file") or not folder.resolve().is_relative_to(root):
        raise BertflowError(f"--model {uri} is outside this project ({root}); loading a model runs "
                            "the code it holds (models from code, a loader module, a pickle): pass "
                            "--trust-model if you trust who wrote it")
    if not (folder / "MLmodel").is_file():
        raise BertflowError(f"--model {uri}: no MLflow model there (no MLmodel file); a registered "
                            "model is models:/TASK/VERSION")
    found = code_in(folder)
    raise BertflowError(f"--model {uri} is a model folder, not a model of the project's registry, and "
                        f"loading it runs the code it holds ({', '.join(found[:3])}"
                        f"{', ...' if len(found) > 3 else ''}): pass --trust-model if you trust who "
                        "wrote it, or give a models:/ or runs:/ URI")


def load_pyfunc(uri: str, local: Path, backend: str):
    """The pyfunc model of `uri`, from its checked folder `local` (_fetch_model), on `backend`
    (through the environment, as the REST server gets it: any registered model, new or old,
    reads it there); a model MLflow or the backend cannot load is one clear line naming it."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from components.lifecycle.backends import BACKEND_ENV

    os.environ[BACKEND_ENV] = backend
    try:
        return mlflow.pyfunc.load_model(str(local))
    except MlflowException as e:
        raise BertflowError(f"cannot load model {uri}: {e.message.splitlines()[0]}") from None
    except BertflowError as e:
        raise BertflowError(_named_by_uri(str(e), uri, local)) from None


def check_backend_of(uri: str, local: Path, backend: str) -> None:
    """Refuse a model bertflow saved, fetched into `local`, that cannot run on `backend`: one
    line now, not a server's traceback when it loads the model. Another model is MLflow's."""
    from components.lifecycle.backends import TASK_MODEL, check_backend

    if not (local / TASK_MODEL / "bertflow.json").is_file():
        return
    try:
        check_backend(local / TASK_MODEL, backend)
    except BertflowError as e:
        raise BertflowError(_named_by_uri(str(e), uri, local)) from None


def _named_by_uri(message: str, uri: str, local: Path) -> str:
    """`message` about a model's files, with the temporary folder it was fetched into (gone
    when the command ends) named by the model's URI instead."""
    if Path(uri) == local:
        return message
    return f"model {uri}: {message.replace(f'{local}/', '').replace(str(local), '.')}"
