"""Pretraining recipe ablation: each recipe trained for a wall-clock budget on the default data.

Every run first measures its own seconds per step (the time difference between a 20-step and
an 80-step run, so start-up is not counted), then sets `max_steps` so that warmup and linear
decay end within the budget, trains, and records the held-out curve.

Usage:  python benchmarks/pretrain_recipes.py [--only P3 K2] [--workdir DIR]
Needs the data stages' outputs (`bertflow run --until pairs`); S32 also needs 32-token pairs,
which it builds into DIR. Results: DIR/<name>.json; the table is in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.core.config import ModelSize, load_params  # noqa: E402

TWO = {"layers": 2, "hidden": 256, "heads": 4, "intermediate": 1024}
FOUR = {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024}
PLAIN = {"embedding_init": "random", "short_seq_len": 0, "short_seq_steps": 0}
RECIPES = {  # name: (minutes, model size, pretrain overrides, pairs max_seq_len)
    "A": (8, FOUR, {**PLAIN, "lr": 1e-3}, 128),
    "P1": (6, TWO, {**PLAIN, "lr": 1e-3}, 128),
    "P2": (6, TWO, {**PLAIN, "lr": 1e-3, "position_init": "sinusoidal"}, 128),
    "P3": (6, TWO, {**PLAIN, "lr": 1e-3, "position_init": "sinusoidal", "embedding_init": "corpus_svd"}, 128),
    "P4": (6, TWO, {**PLAIN, "lr": 2e-3, "position_init": "sinusoidal", "embedding_init": "corpus_svd"}, 128),
    "S32": (5, TWO, {**PLAIN, "lr": 1e-3, "embedding_init": "corpus_svd", "batch_size": 128}, 32),
    "K2": (8, TWO, {"lr": 1e-3, "embedding_init": "corpus_svd", "short_seq_len": 32,
                    "short_fraction": 0.6}, 128),
}


def train(work: Path, name: str) -> dict:
    from components.data.pairs import make_pairs
    from components.training.pretrain import pretrain

    minutes, size, over, seq = RECIPES[name]
    p = load_params(ROOT / "params.yaml")
    presets = {**p.model.presets, "probe": ModelSize(**size)}
    model = dataclasses.replace(p.model, preset="probe", presets=presets)
    pairs = ROOT / p.paths.pairs
    if seq != p.pairs.max_seq_len:
        pairs = work / f"pairs{seq}"
        if not pairs.exists():
            make_pairs(dataclasses.replace(p.pairs, max_seq_len=seq), p.executor, ROOT / p.paths.clean,
                       ROOT / p.paths.tokenizer, pairs)
    fraction = over.get("short_fraction", 0.0)
    over = {k: v for k, v in over.items() if k != "short_fraction"}
    quiet = {"val_every_steps": 10**9, "snapshot_every_steps": 10**9, "log_every_steps": 10**9}

    def run(steps: int, **extra) -> tuple[float, dict]:
        cfg = dataclasses.replace(p.pretrain, **{**over, **quiet, "max_steps": steps, **extra})
        start = time.perf_counter()
        stats = pretrain(model, cfg, pairs, ROOT / p.paths.tokenizer, work / f"{name}-export",
                         work / "checkpoints")
        return time.perf_counter() - start, stats

    short = {"warmup_steps": 0, "short_seq_steps": 0}
    per_step = (run(80, **short)[0] - run(20, **short)[0]) / 60
    steps = int(minutes * 60 / per_step * 0.97)
    wall, stats = run(steps, warmup_steps=max(1, steps // 10), short_seq_steps=int(steps * fraction),
                      val_every_steps=max(1, steps // 8), max_minutes=minutes * 1.5)
    result = {**stats, "recipe": name, "minutes_budget": minutes, "per_step_s": per_step,
              "wall_minutes": wall / 60, "config": {"size": size, "pretrain": over, "seq": seq,
                                                    "short_fraction": fraction}}
    (work / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertflow-recipes"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        r = train(args.workdir, name)
        print(f"{name}: held-out MLM accuracy {r['mlm_accuracy']:.3f}, loss {r['mlm_loss']:.3f}, "
              f"{r['tokens']:,} tokens in {r['wall_minutes']:.1f} min", flush=True)


if __name__ == "__main__":
    main()
