"""The learning-rate search of a start: with several rates (a task's `lr` list), its first seed
trains at every rate; the rate with the best validation metric trains the other seeds, and the
winning trial is the start's first fit (no test prediction is made for a losing trial)."""

from __future__ import annotations

from components.training.fits import Job, run_jobs
from components.training.plan import FitPlan


def search_rate(plan: FitPlan, rates: list[float], workers: int) -> tuple[float, dict | None, dict]:
    """The rate the start's fits train at, the winning trial (None without a search: one rate)
    and the search's record (`lr`, `trials` by rate, and each trial's minutes)."""
    if len(rates) == 1:
        return rates[0], None, {}
    seed = plan.first_seed
    trials = run_jobs(plan, [Job(seed, lr, trial=True) for lr in rates], workers,
                      f"lr search {plan.name} {plan.start.init}")
    winner = max(trials, key=lambda t: t["best_val_metric"])  # the first on a tie
    record = {"lr": winner["lr"], "trials": {f"{t['lr']:g}": {k: t[k] for k in ("steps", "best_val_metric")}
                                             for t in trials},
              "minutes": {f"{t['lr']:g}": t["minutes"] for t in trials}}
    return winner["lr"], winner, record
