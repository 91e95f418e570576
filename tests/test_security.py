"""Exposure: no credentials or tokens in logs, error output, MLflow params or tags; the server
a run starts listens on loopback. (Safe loading: test_bad_input.py and test_lifecycle.py.)"""

from __future__ import annotations

import logging

import pytest

from components.core.redact import install_log_redaction, redact
from tests.conftest import run_cli, section, small_params, write_params

SECRET = "hunter2-s3cr3t"


def test_redact_masks_url_passwords_and_secret_environment_values(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "AKIAxyzSECRETvalue")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-123456789")
    monkeypatch.setenv("CI", "true")  # not a secret's name: its value stays
    text = ("connect to https://bob:pa55word@mlflow.example.com:5000/api failed; "
            "key AKIAxyzSECRETvalue, header Bearer tok-123456789, CI=true, s3://bucket/path")
    assert redact(text) == ("connect to https://bob:***@mlflow.example.com:5000/api failed; "
                            "key ***, header Bearer ***, CI=true, s3://bucket/path")


@pytest.mark.parametrize(("uri", "masked"), [
    ("http://ghp_abcdef123456@mlflow.example.com/", "http://***@mlflow.example.com/"),
    ("https://mlflow.example.com/api?access_token=abc123def&experiment=7",
     "https://mlflow.example.com/api?access_token=***&experiment=7"),
    ("s3://bucket/m.bin?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=f00d&x=1",
     "s3://bucket/m.bin?X-Amz-Credential=***&X-Amz-Signature=***&x=1"),
    ("postgresql://bob:pa55@db:5432/mlflow?sslmode=require&password=pa55",
     "postgresql://bob:***@db:5432/mlflow?sslmode=require&password=***"),
    ("https://mlflow.example.com/#/experiments/1?tab=runs", "https://mlflow.example.com/#/experiments/1?tab=runs"),
])
def test_tokens_in_userinfo_and_query_parameters_are_masked(uri, masked):
    assert redact(f"error: cannot reach {uri} (timeout)") == f"error: cannot reach {masked} (timeout)"


def test_log_records_are_redacted_whatever_handler_writes_them(monkeypatch, caplog):
    monkeypatch.setenv("PREFECT_API_KEY", SECRET)
    install_log_redaction()
    try:
        raise ConnectionError(f"refused by postgresql://app:{SECRET}@db:5432/mlflow")
    except ConnectionError:
        logging.getLogger("some.library").exception("lost the store at %s", f"key={SECRET}")
    [record] = caplog.records
    text = caplog.text + (record.exc_text or "")
    assert SECRET not in text
    assert "lost the store at key=***" in text and "postgresql://app:***@db:5432" in text


@pytest.mark.slow
def test_a_failing_tracking_server_url_is_not_printed_with_its_password(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # the default: a temporary server
    # MLflow names the server in its error: the token must not come with it (the user:password
    # form is masked the same way: the Prefect state test below).
    uri = f"http://{SECRET}@127.0.0.1:9/?access_token={SECRET}"
    params = write_params(tmp_path, small_params(tracking={"uri": uri}))
    proc = run_cli("bertflow", "run", "--until", "ingest", "-p", str(params), cwd=tmp_path,
                   check=False, env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                                     "AWS_SECRET_ACCESS_KEY": "aws-" + SECRET})
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert "http://***@127.0.0.1:9" in output
    assert SECRET not in output
    # The Prefect API the run starts for itself listens on loopback only.
    assert "temporary server on http://127.0.0.1:" in output


def test_mlflow_params_and_tags_hold_no_secrets(tmp_path, monkeypatch):
    from components.core import tracking
    from components.core.config import TrackingConfig

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    cfg = section(TrackingConfig, uri="sqlite:///mlflow.db")
    with tracking.mlflow_run(cfg, tmp_path, "stage", tags={"note": f"pw {SECRET}"}) as run:
        run.log_params({"executor": {"dask_address": f"tcp://user:{SECRET}@scheduler:8786"}})
        run_id = run.run_id
    data = tracking.client(cfg, tmp_path).get_run(run_id).data
    assert data.params["executor.dask_address"] == "tcp://user:***@scheduler:8786"
    assert data.tags["note"] == "pw ***"


@pytest.mark.slow
def test_a_failed_flow_run_keeps_no_secret_in_its_prefect_state(tmp_path, prefect_api, monkeypatch):
    from pipeline.flow import pipeline_flow

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    params = write_params(tmp_path, small_params(tracking={"uri": f"http://alice:{SECRET}@127.0.0.1:9"}))
    state = pipeline_flow(str(params), "ingest", return_state=True)
    assert state.is_failed()
    assert "http://alice:***@127.0.0.1:9" in state.message and SECRET not in state.message


@pytest.mark.slow
def test_mlflows_own_view_run_lines_come_out_without_the_password(tmp_path):
    """MLflow prints "View run ... at: <tracking URI>" to stdout itself, past any logger."""
    from tests.conftest import BIN
    from tests.test_lifecycle import _env, _free_port, _start, _stop

    port = _free_port()
    server = _start([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
                     "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"],
                    tmp_path, _env(), f"http://127.0.0.1:{port}/health", tmp_path / "server.log")
    try:
        params = write_params(tmp_path / "project", small_params(tracking={
            "uri": f"http://alice:{SECRET}@127.0.0.1:{port}"}, ingest={"sources": [
                {"name": "mine", "kind": "txt_dir", "path": "corpus"}]}))
        (tmp_path / "project" / "corpus").mkdir()
        (tmp_path / "project" / "corpus" / "a.txt").write_text("One sentence here. And another one.\n")
        proc = run_cli("bertflow", "stage", "ingest", "-p", str(params), cwd=tmp_path / "project",
                       check=False, env={"MLFLOW_TRACKING_PASSWORD": ""})
    finally:
        _stop(server)
    output = proc.stdout + proc.stderr
    assert "View run ingest at: http://alice:***@127.0.0.1:" in output, output[-3000:]
    assert SECRET not in output
