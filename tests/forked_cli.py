"""`bertflow` commands for the tests, each a real process of its own, forked from one that has
already imported the heavy libraries.

A `bertflow` process spends most of its CPU importing torch, Lightning, MLflow and Great
Expectations before it does anything (20 CPU-seconds for a `bertflow run` on a 2-core AVX2
machine); the suite starts about ninety. This server, one per test process, imports them once;
for each command it forks a child that takes the command's working folder, environment, argv and
output files, runs the console script's `main()` and exits as that script would (atexit handlers
run, its exit code). Prefect and the project's own code are not preloaded: they read settings
from the environment when imported, so each child imports them under its own environment.
Commands whose process itself is under test (killed, locked, served) still start the console
script with subprocess.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import subprocess
import sys
import threading
import traceback
import types
from pathlib import Path

# Environment-independent at import, and what a command spends its start-up on.
PRELOAD = ("torch", "lightning", "mlflow", "mlflow.pyfunc", "mlflow.store.tracking.sqlalchemy_store",
           "great_expectations", "dvc.repo", "pandas", "pyarrow.dataset", "sklearn.metrics", "onnxruntime")


class Server:
    """The forking server of this test process, started at its first command."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forked_cli"], cwd=root,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()

    def run(self, args: list[str], cwd: Path, env: dict[str, str], out: Path, err: Path) -> int:
        """Run `bertflow ARGS` in a forked child; its exit code (stdout, stderr in `out`, `err`)."""
        request = {"args": args, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        with self.lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"the forking server ended (exit code {self.proc.poll()})")
        return int(reply)


def _child(request: dict) -> None:
    """In the forked child: become `bertflow ARGS` and exit with its code."""
    code = 1
    try:
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(os.devnull)  # the process's own, for its lifetime
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # The console script's own __main__ and argv: launchers that start the command again
        # (Lightning's DDP ranks, multiprocessing's spawn) start `python bin/bertflow ARGS`.
        script = str(Path(sys.executable).parent / "bertflow")
        sys.modules["__main__"] = types.ModuleType("__main__")
        sys.modules["__main__"].__file__ = script
        sys.argv = [script, *request["args"]]
        from pipeline.cli import main

        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
    except BaseException:  # reported on the command's stderr, as Python would
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    """Import PRELOAD, then fork a child per request line on stdin; answer its exit code."""
    for name in PRELOAD:
        importlib.import_module(name)
    assert "prefect" not in sys.modules and "pipeline" not in sys.modules, "preloaded too much"
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    serve()
