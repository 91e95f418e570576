"""Pretraining recipe ablation: each recipe trained for a wall-clock budget on the default data,
then (rows with `probe`) scored by the transfer probe on the tasks' validation splits.

Every run first measures its own seconds per step (the time difference between a 20-step and
an 80-step run, so start-up is not counted), then sets `max_steps` so that warmup and linear
decay end within the budget, trains, and records the held-out curve. Each row's tokenizer and
pairs are built into DIR first (seconds, once per setting).

Usage:  python -m benchmarks.experiments.pretrain_recipes [--only SOP ELECTRA] [--workdir DIR] [--steps N]
        [--probe-seeds 1 2 3] [--step-cost]
Needs the data stages' outputs (`bertflow run --until pairs`) and the prepared tasks
(`bertflow stage task_data@TASK` for each task of params.yaml; `make run` makes both).
Results: DIR/<name>.json; the table is in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from components.core.config import ModelSize, Params
from components.core.params import load_params

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

TWO = {"layers": 2, "hidden": 256, "heads": 4, "intermediate": 1024}
FOUR = {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024}
PLAIN = {"embedding_init": "random", "short_seq_len": 0, "short_seq_steps": 0}
# Every row was measured against the 8k lowercased tokenizer: rows train on it unless they say
# otherwise, so each command still reproduces its row whatever params.yaml's tokenizer is.
MEASURED = {"lowercase": True, "vocab_size": 8192}
# ... and in fp32 (before `precision: auto` took bf16 on CPUs with AMX): rows train and probe in it.
PRECISION = "32-true"


@dataclass(frozen=True)
class Recipe:
    """One row: a budget, a shape and what differs from params-classic.yaml (the recipe of then)."""

    minutes: float
    """Wall-clock budget of the training run (calibration not counted)."""
    pretrain: dict
    """Overrides of the pretrain section."""
    size: dict = field(default_factory=lambda: TWO)
    """The encoder's shape."""
    pairs: dict = field(default_factory=dict)
    """Overrides of the pairs section (mode, max_seq_len)."""
    tokenizer: dict = field(default_factory=dict)
    """Overrides of the tokenizer section (vocab_size, lowercase) over MEASURED."""
    short_fraction: float = 0.0
    """Share of the steps in the 32-token curriculum phase."""
    probe: bool = False
    """Score the encoder with the transfer probe."""


# The rows that got pretraining out of the plateau (MLM figures only) ...
RECIPES = {
    "A": Recipe(8, {**PLAIN, "lr": 1e-3}, FOUR),
    "P1": Recipe(6, {**PLAIN, "lr": 1e-3}),
    "P2": Recipe(6, {**PLAIN, "lr": 1e-3, "position_init": "sinusoidal"}),
    "P3": Recipe(6, {**PLAIN, "lr": 1e-3, "position_init": "sinusoidal", "embedding_init": "corpus_svd"}),
    "P4": Recipe(6, {**PLAIN, "lr": 2e-3, "position_init": "sinusoidal", "embedding_init": "corpus_svd"}),
    "S32": Recipe(5, {**PLAIN, "lr": 1e-3, "embedding_init": "corpus_svd", "batch_size": 128},
                  pairs={"max_seq_len": 32}),
    "K2": Recipe(8, {"lr": 1e-3, "embedding_init": "corpus_svd", "short_seq_len": 32}, short_fraction=0.6),
}
# ... and the recipe of the time (8k lowercased, BASELINE) with one lever changed, 40 minutes each, probed.
LEVERS = {
    "BASELINE": ({}, {}, {}),
    "M20": ({"mlm_probability": 0.20, "max_predictions_per_seq": 26}, {}, {}),
    "M30": ({"mlm_probability": 0.30, "max_predictions_per_seq": 39}, {}, {}),
    "SPAN": ({"masking": "span"}, {}, {}),
    # Beyond the list: whole-word masking (Google's BERT release of May 2019; Cui et al.
    # 2021) masks every piece of a word, so a word is never guessed from its own other pieces.
    "WWM": ({"masking": "whole_word"}, {}, {}),
    "V4K": ({}, {}, {"vocab_size": 4096}),
    "V16K": ({}, {}, {"vocab_size": 16384}),
    "CASED": ({}, {}, {"lowercase": False}),
    # The best lowercased lever (V16K) with casing, the best lever for NER.
    "CASED16K": ({}, {}, {"lowercase": False, "vocab_size": 16384}),
    "SOP": ({}, {"mode": "sop"}, {}),
    "PACK": ({}, {"mode": "packing"}, {}),
    "ELECTRA": ({"objective": "electra"}, {}, {}),
    # Two levers together, as cramming trains (no NSP, a higher masking rate): run time-matched.
    "PACK30": ({"mlm_probability": 0.30, "max_predictions_per_seq": 39}, {"mode": "packing"}, {}),
    # The two levers of the best three-seed probe means, which move different tasks (casing NER,
    # packing every task a little); neither changes what a step costs.
    "CASEDPACK": ({}, {"mode": "packing"}, {"lowercase": False}),
}
RECIPES.update({name: Recipe(40, pretrain, pairs=pairs, tokenizer=tok, short_fraction=0.5, probe=True)
                for name, (pretrain, pairs, tok) in LEVERS.items()})


def _key(*parts: object) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=4).hexdigest()


def data_for(p: Params, recipe: Recipe, work: Path) -> tuple[Path, Path]:
    """The tokenizer and pairs folders the recipe trains on, built in `work` once per setting
    (seconds), not the pipeline's, which follow params.yaml's tokenizer."""
    from components.data.pairs import make_pairs
    from components.data.tokenizer import train_tokenizer

    tok = {**MEASURED, **recipe.tokenizer}
    tokenizer = work / f"tokenizer-{_key(tok)}"
    if not tokenizer.exists():
        train_tokenizer(p.tokenizer.model_copy(update=tok), ROOT / p.paths.clean, tokenizer,
                        max_len=p.model.max_position)
    pairs = work / f"pairs-{_key(tok, recipe.pairs)}"
    if not pairs.exists():
        make_pairs(p.pairs.model_copy(update=recipe.pairs), p.executor, ROOT / p.paths.clean,
                   tokenizer, pairs)
    return tokenizer, pairs


def runner(work: Path, name: str):
    """The params and a function that trains recipe `name` for some steps: (seconds, stats)."""
    from components.training.pretrain import pretrain

    recipe = RECIPES[name]
    p = load_params(ROOT / "params-classic.yaml")  # the classic recipe these rows measure
    presets = {**p.model.presets, "probe": ModelSize(**recipe.size)}
    model = p.model.model_copy(update={"preset": "probe", "presets": presets})
    tokenizer, pairs = data_for(p, recipe, work)
    quiet = {"val_every_steps": 10**9, "snapshot_every_steps": 10**9, "log_every_steps": 10**9}

    def run(steps: int, **extra) -> tuple[float, dict]:
        cfg = p.pretrain.model_copy(update={"precision": PRECISION, **recipe.pretrain, **quiet,
                                            "max_steps": steps, **extra})
        start = time.perf_counter()
        stats = pretrain(model=model, cfg=cfg, pairs_dir=pairs, tokenizer_dir=tokenizer,
                         out_dir=work / f"{name}-export", work_dir=work / "checkpoints")
        return time.perf_counter() - start, stats

    return p, run


def step_seconds(run) -> float:
    """Seconds per full-length step: an 80-step run less a 20-step run, so start-up is not counted."""
    short = {"warmup_steps": 0, "short_seq_steps": 0}
    return (run(80, **short)[0] - run(20, **short)[0]) / 60


def train(work: Path, name: str, steps: int | None = None, probe_seeds: list[int] | None = None) -> dict:
    recipe = RECIPES[name]
    p, run = runner(work, name)
    # The budget is minutes; a row's step count (in its JSON) reproduces it exactly via --steps.
    per_step, guard = None, 0.0  # given steps run to the end: the guard would change the model
    if steps is None:
        per_step = step_seconds(run)
        steps, guard = int(recipe.minutes * 60 / per_step * 0.97), recipe.minutes * 1.5
    wall, stats = run(steps, warmup_steps=max(1, steps // 10),
                      short_seq_steps=int(steps * recipe.short_fraction),
                      val_every_steps=max(1, steps // 8), max_minutes=guard)
    result = {**stats, "recipe": name, "minutes_budget": recipe.minutes, "per_step_s": per_step,
              "wall_minutes": wall / 60, "config": dataclasses.asdict(recipe)}
    if recipe.probe:
        result["probe"] = probe_encoder(p, work / f"{name}-export", work / "probe", probe_seeds)
    (work / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def probe_encoder(p: Params, encoder: Path, work: Path, seeds: list[int] | None = None) -> dict:
    """The transfer probe's validation scores of an encoder (components.training.probe.py)."""
    from components.training.probe import probe

    cfg = p.finetune.model_copy(update={"precision": PRECISION})
    return probe(encoder, p.finetune.tasks, cfg, ROOT / p.paths.tasks, work, seeds)


def compare_step_cost(work: Path, names: list[str]) -> None:
    """Print each row's seconds per full-length step, median of 3 interleaved timings (a busy spell
    of the machine hits every row alike), and its ratio to the first row's."""
    runs = {name: runner(work, name)[1] for name in names}
    timed = {name: [] for name in runs}
    for _ in range(3):
        for name, run in runs.items():
            timed[name].append(step_seconds(run))
    median = {name: statistics.median(seconds) for name, seconds in timed.items()}
    for name, seconds in median.items():
        print(f"{name}: {seconds:.3f} s per full-length step, "
              f"{seconds / median[names[0]]:.2f}x {names[0]}'s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertflow-recipes"))
    parser.add_argument("--steps", type=int, help="Train this many steps instead of calibrating "
                        "the minutes budget (to reproduce a row).")
    parser.add_argument("--probe-seeds", nargs="+", type=int, default=[1],
                        help="Fine-tuning seeds of the probe (one seed moves its mean ~half a point).")
    parser.add_argument("--step-cost", action="store_true", help="Only time a full-length step of "
                        "each row, side by side, as a ratio to the first row's.")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.step_cost:
        compare_step_cost(args.workdir, args.only)
        return
    for name in args.only:
        r = train(args.workdir, name, args.steps, args.probe_seeds)
        probed = f", probe mean {r['probe']['mean']:.3f}" if "probe" in r else ""
        print(f"{name}: held-out MLM accuracy {r['mlm_accuracy']:.3f}, loss {r['mlm_loss']:.3f}, "
              f"{r['tokens']:,} tokens in {r['wall_minutes']:.1f} min{probed}", flush=True)


if __name__ == "__main__":
    main()
