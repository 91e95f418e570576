"""Serving under load: 1,000 concurrent requests on loopback to a task's champion served by
`mlflow models serve`, each answer checked against the offline prediction of the same text.

Usage:  python -m benchmarks.speed.serve_load [--task movie-sentiment] [--requests 1000] [--workers 2]
Needs the registry of a `make run`. Writes the "Serving under load" section of
benchmarks/RESULTS.md: errors, mismatches, latency percentiles and requests/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.results import measured, write_section
from benchmarks.speed.predict_throughput import sentences
from components.core.params import load_params

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Serving under load"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_uri: str, tracking_uri: str, port: int, workers: int) -> subprocess.Popen:
    """`mlflow models serve` in its own process group; returns once /ping answers."""
    import httpx

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [str(bin_dir / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager", "local",
         "-h", "127.0.0.1", "-p", str(port), "-w", str(workers)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(180):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("the model server did not start")


async def fire(url: str, texts: list[str]) -> list[tuple[float, int, dict | None]]:
    """All requests at once (one text each); (seconds, status, answer) per request."""
    import httpx

    limits = httpx.Limits(max_connections=len(texts), max_keepalive_connections=len(texts))
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:
        async def one(text: str):
            start = time.perf_counter()
            try:
                r = await client.post(url, json={"dataframe_records": [{"text": text}]})
                answer = r.json()["predictions"][0] if r.status_code == 200 else None
                return time.perf_counter() - start, r.status_code, answer
            except httpx.HTTPError:
                return time.perf_counter() - start, 0, None

        return await asyncio.gather(*(one(t) for t in texts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="movie-sentiment")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--project", type=Path, default=ROOT, help="the checkout that ran the pipeline")
    args = parser.parse_args()

    import mlflow
    import pandas as pd

    from components.core import tracking

    p = load_params(args.project / "params.yaml")
    uri = tracking.tracking_uri(p.tracking, args.project)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    model_uri = f"models:/{args.task}@champion"
    texts = sentences(args.project / p.paths.tasks / args.task, args.requests)
    offline = mlflow.pyfunc.load_model(model_uri).predict(pd.DataFrame({"text": texts}))

    port = free_port()
    server = start_server(model_uri, uri, port, args.workers)
    try:
        start = time.perf_counter()
        results = asyncio.run(fire(f"http://127.0.0.1:{port}/invocations", texts))
        wall = time.perf_counter() - start
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the whole group: workers too
        server.wait(30)

    errors = sum(status != 200 for _, status, _ in results)
    mismatches = sum(a is not None and (a["label"] != o["label"] or abs(a["score"] - o["score"]) > 1e-5)
                     for (_, _, a), o in zip(results, offline, strict=True))
    ms = sorted(1000 * s for s, _, _ in results)
    pct = {q: ms[min(len(ms) - 1, int(q / 100 * len(ms)))] for q in (50, 90, 99)}
    print({"errors": errors, "mismatches": mismatches, "wall_s": wall, **pct, "max": ms[-1],
           "mean": statistics.mean(ms)})
    write_section("\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.serve_load --task {args.task} --requests {args.requests} "
        f"--workers {args.workers}` (needs `make run` first).", "",
        f"`mlflow models serve -m {model_uri} --env-manager local -w {args.workers}` on 127.0.0.1; "
        f"{len(texts):,} requests of one sentence each, all sent at once from one asyncio client "
        "(one connection per request); each answer compared with the offline pyfunc prediction "
        "of the same sentence (label equal, score within 1e-5).", "",
        "| requests | errors | answers ≠ offline | p50 ms | p90 ms | p99 ms | max ms | requests/s |",
        "|---|---|---|---|---|---|---|---|",
        f"| {len(texts):,} | **{errors}** | **{mismatches}** | {pct[50]:,.0f} | {pct[90]:,.0f} | "
        f"{pct[99]:,.0f} | {ms[-1]:,.0f} | {len(texts) / wall:,.0f} |", "",
        f"Latencies are queueing-dominated: all {len(texts):,} requests arrive at once and the "
        f"server works through them {args.workers} at a time, so most wait behind the others (the "
        f"whole burst drained in {wall:.1f} s, about {1000 * wall * args.workers / len(texts):.0f} ms "
        "of server time per request per worker). For throughput, send many rows per request: "
        "the model itself does hundreds of sentences per second in batches (see Batch "
        "prediction).", ""]))


if __name__ == "__main__":
    main()
