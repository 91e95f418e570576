"""Data-path throughput and memory, measured side by side in one run.

1. Throughput: the `pairs` stage (read clean shards, tokenize, build NSP instances, write and
   validate Parquet) against bare `tokenizers.Tokenizer.encode_batch` on the same sentences with
   the same tokenizer, interleaved `--repeats` times; both as input tokens per second.
2. Memory: peak RSS of the whole process tree (stage process plus its shard workers) of the
   `clean` and `pairs` stages at 1x and 4x the default corpus. The 4x corpus is the 1x shards
   copied four times under new document ids (clean still reads and processes all of it; its
   dedup then drops the copies).

Usage:  python -m benchmarks.speed.data_throughput [--workdir DIR] [--repeats 3]
Writes the "Data path" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.results import measured, write_section
from components.core.io import list_shards
from components.core.params import load_params

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Data path"


def prepare(work: Path) -> None:
    """ingest, clean and tokenizer on the default corpus (skipped if already there)."""
    from components.data.clean import clean
    from components.data.ingest import ingest
    from components.data.tokenizer import train_tokenizer

    p = load_params(ROOT / "params-classic.yaml")  # the classic recipe these rows measure
    if not (work / "tokenizer" / "tokenizer.json").exists():
        ingest(p.ingest, ROOT, ROOT / p.paths.packages, work / "raw")
        clean(p.clean, p.executor, work / "raw", work / "clean")
        train_tokenizer(p.tokenizer, work / "clean", work / "tokenizer")


def throughput(work: Path, repeats: int) -> dict:
    from tokenizers import Tokenizer

    from components.data import validation
    from components.data.pairs import make_pairs

    p = load_params(ROOT / "params-classic.yaml")  # the classic recipe these rows measure
    tok = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json"))
    sentences = [s for split in ("train", "heldout") for path in list_shards(work / "clean" / split)
                 for doc in pq.read_table(path)["sentences"].to_pylist() for s in doc]
    tokens = sum(len(e.ids) for e in tok.encode_batch(sentences, add_special_tokens=False))
    validation._batch_definition()  # import GX once, as a long-running worker would have
    bare, path = [], []
    for _ in range(repeats):  # interleaved, so both see the same machine state
        start = time.perf_counter()
        tok.encode_batch(sentences, add_special_tokens=False)
        bare.append(time.perf_counter() - start)
        start = time.perf_counter()
        make_pairs(p.pairs, p.executor, work / "clean", work / "tokenizer", work / "pairs")
        path.append(time.perf_counter() - start)
    return {
        "sentences": len(sentences),
        "tokens": tokens,
        "bare_tokens_per_s": tokens / statistics.median(bare),
        "pairs_tokens_per_s": tokens / statistics.median(path),
        "ratio": statistics.median(bare) / statistics.median(path),
        "bare_s": bare,
        "pairs_s": path,
        "workers": p.executor.workers or os.cpu_count(),
    }


def replicate(src: Path, dst: Path, times: int, rename: bool) -> None:
    """Copy every shard of `src` `times` times into `dst` (doc ids made unique if `rename`)."""
    dst.mkdir(parents=True, exist_ok=True)
    index = 0
    for k in range(times):
        for path in list_shards(src):
            table = pq.read_table(path)
            if rename:
                ids = [f"{d}#{k}" for d in table["doc_id"].to_pylist()]
                table = table.set_column(table.schema.get_field_index("doc_id"), "doc_id",
                                         pa.array(ids, pa.string()))
            pq.write_table(table, dst / f"part-{index:05d}.parquet")
            index += 1


def peak_rss(code: str) -> tuple[float, float]:
    """Run `code` in a fresh Python; return (peak MiB of the whole process tree, seconds)."""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    parent = psutil.Process(proc.pid)
    peak = 0
    start = time.perf_counter()
    while proc.poll() is None:
        try:
            procs = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    if proc.returncode:
        raise SystemExit(f"stage failed: {code}")
    return peak / 2**20, time.perf_counter() - start


def memory(work: Path) -> dict:
    out = {}
    for scale in (1, 4):
        base = work / f"x{scale}"
        if not base.exists():
            replicate(work / "raw", base / "raw", scale, rename=True)
            for split in ("train", "heldout"):
                replicate(work / "clean" / split, base / "clean" / split, scale, rename=False)
        setup = (f"from pathlib import Path; from components.core.params import load_params; "
                 f"p = load_params('{ROOT / 'params-classic.yaml'}'); b = Path('{base}'); ")
        out[f"clean_x{scale}"] = peak_rss(
            setup + "from components.data.clean import clean; "
                    "clean(p.clean, p.executor, b / 'raw', b / 'clean-out')")
        out[f"pairs_x{scale}"] = peak_rss(
            setup + f"from components.data.pairs import make_pairs; make_pairs(p.pairs, p.executor, "
                    f"b / 'clean', Path('{work / 'tokenizer'}'), b / 'pairs')")
    return out


def report(t: dict, m: dict, command: str) -> str:
    lines = [
        SECTION, "", measured(), "",
        f"Reproduce: `{command}` (default params, {t['workers']} shard workers).",
        "",
        f"Corpus: the default one after cleaning, {t['sentences']:,} sentences, "
        f"{t['tokens']:,} tokens.",
        "",
        "| measure | bare `encode_batch` | `pairs` stage | ratio (target ≥ 0.50) |",
        "|---|---|---|---|",
        f"| input tokens/s (median of {len(t['bare_s'])}, interleaved) | "
        f"{t['bare_tokens_per_s']:,.0f} | {t['pairs_tokens_per_s']:,.0f} | **{t['ratio']:.2f}** |",
        "",
        "The `pairs` figure is the whole stage: reading shards, tokenizing, Google's instance "
        "construction, Parquet writing and the Great Expectations suite per shard (GX imported "
        "once beforehand).",
        "",
        "| stage | peak RSS 1x (MiB) | peak RSS 4x (MiB) | 4x / 1x (target ≤ 1.25) "
        "| growth 1x→4x (MiB) | seconds 1x / 4x |",
        "|---|---|---|---|---|---|",
    ]
    for stage in ("clean", "pairs"):
        (m1, s1), (m4, s4) = m[f"{stage}_x1"], m[f"{stage}_x4"]
        lines.append(f"| {stage} | {m1:,.0f} | {m4:,.0f} | **{m4 / m1:.2f}** | {m4 - m1:+,.0f} "
                     f"| {s1:.1f} / {s4:.1f} |")
    lines += ["", "Peak RSS is the sum over the stage process and its shard workers, sampled "
              "every 50 ms. Most of it is the libraries each process imports (~300 MiB each); "
              "the growth column is what 3x more data added.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertflow-bench"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    prepare(args.workdir)
    t = throughput(args.workdir, args.repeats)
    m = memory(args.workdir)
    print(json.dumps({"throughput": t, "memory": m}, indent=2))
    write_section(report(t, m, "python -m benchmarks.speed.data_throughput"))


if __name__ == "__main__":
    main()
