"""The transfer probe: what an encoder buys downstream, in a few CPU-minutes, for choosing a
pretraining recipe by its use rather than by its held-out MLM accuracy.

Fixed short protocol: each probe task fine-tuned once (one seed, the task's set rate or the
first of its grid, its epochs) from the encoder, on a seeded sample of its training split,
scored on its validation split. The test split is never read, so recipes can be chosen by the
probe and the test figures still be reported once. The tasks cover what recipes trade off:
question type (trec-6), sentiment (movie-sentiment), entities (conll2003-ner) and discourse
order (news-order); `mean` is their unweighted mean. With several seeds each score is the mean
over seeds, and the per-seed values are kept: a lever has to move `mean` by more than the spread
between seeds (`mean_std`) to count.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from components.core.config import FinetuneConfig, TaskConfig
from components.core.errors import ConfigError
from components.training.finetune import probe_fits

PROBE = {"trec-6": 0, "movie-sentiment": 3000, "conll2003-ner": 3000, "news-order": 3000}
"""Probe task -> training examples sampled (0: the whole split)."""


def probe(encoder_dir: Path, tasks: dict[str, TaskConfig], cfg: FinetuneConfig, tasks_dir: Path,
          work_dir: Path, seeds: list[int] | None = None) -> dict:
    """Best validation metric per probe task (and their mean) of the encoder in `encoder_dir`,
    with the tasks' settings from `tasks` and the prepared data in `tasks_dir/<task>`."""
    missing = [name for name in PROBE if name not in tasks]
    if missing:
        raise ConfigError(f"probe: finetune.tasks lacks {', '.join(missing)}; the probe uses the "
                          f"built-in tasks {', '.join(PROBE)}")
    seeds = list(dict.fromkeys(seeds or [1]))  # a repeated seed would repeat its fit
    # The fixed protocol: its samples' own epochs, not finetune.min_steps (the probe's budget).
    one = cfg.model_copy(update={"seeds": seeds, "min_steps": 0})
    scores: dict = {"seeds": seeds}
    for name, examples in PROBE.items():
        fits = probe_fits(name, tasks[name], one, Path(tasks_dir) / name, encoder_dir,
                          Path(work_dir) / name, examples)
        by_seed = {f["seed"]: f["best_val_metric"] for f in fits}  # fits may finish in any order
        per_seed = [by_seed[s] for s in seeds]
        scores[name] = {"val_metric": statistics.mean(per_seed), "per_seed": per_seed,
                        "steps": fits[0]["steps"], "lr": fits[0]["lr"],
                        "minutes": sum(f["minutes"] for f in fits)}
    # The four-task mean of each seed: its spread is the noise a recipe's lead must clear.
    mean_per_seed = [statistics.mean(scores[name]["per_seed"][i] for name in PROBE)
                     for i in range(len(seeds))]
    scores["mean"] = statistics.mean(mean_per_seed)
    scores["mean_per_seed"] = mean_per_seed
    scores["mean_std"] = statistics.stdev(mean_per_seed) if len(seeds) > 1 else None
    return scores
