"""Modern against classic encoder, time-matched, with the spread of pretraining itself in it:
each preset pretrained with each of --seeds, each encoder scored by the transfer probe
(components/training/probe.py) with each of --probe-seeds, on the tasks' validation splits.

The first preset's budget is its own `pretrain.max_steps`; every other preset trains for the
steps that take the same wall-clock on this machine. The seconds per step of both phases (the
32-token curriculum steps and the full-length ones) of every preset are timed first, side by
side (an N-step run less an N/4-step one, so start-up is not counted), and each preset keeps the
first one's phase split, warmup share and validation count. The step counts are recorded: a
rerun with `--steps PRESET=N` trains exactly the same encoders anywhere.

Usage:  python -m benchmarks.experiments.arch_probe [--presets params-classic.yaml params.yaml]
        [--seeds 42 43] [--probe-seeds 1 2 3] [--workdir DIR] [--steps params.yaml=N]
        [--encoder params.yaml:42=data/models/encoder]
Needs the data stages' outputs (tokenizer, clean corpus) and the prepared probe tasks (`make
run` makes them). `--encoder` names an encoder already trained as that preset and seed at the
first preset's budget (the reference run's), which is probed instead of trained again.
Results: DIR/<preset>-s<seed>.json; the "Modern against classic" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.results import measured, write_section
from components.core.config import Params
from components.core.params import load_params
from components.training.probe import PROBE, probe

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Modern against classic: the transfer probe, time-matched"
DEFAULT_PRESETS = ["params-classic.yaml", "params.yaml"]
QUIET = {"val_every_steps": 10**9, "snapshot_every_steps": 10**9, "log_every_steps": 10**9}


def pairs_for(p: Params, work: Path) -> Path:
    """The preset's pairs: the pipeline's where its stage built them, else built in `work`."""
    from components.data.pairs import make_pairs

    built = ROOT / p.paths.pairs
    if (built / "train").exists():
        return built
    out = work / f"pairs-{p.pairs.mode}-{p.pairs.max_seq_len}"
    if not out.exists():
        make_pairs(p.pairs, p.executor, ROOT / p.paths.clean, ROOT / p.paths.tokenizer, out)
    return out


def trainer(p: Params, work: Path, name: str):
    """A function that pretrains preset `p` with some pretrain overrides: (seconds, stats)."""
    from components.training.pretrain import pretrain

    pairs = pairs_for(p, work)

    def run(out: Path, **update) -> tuple[float, dict]:
        start = time.perf_counter()
        stats = pretrain(model=p.model, cfg=p.pretrain.model_copy(update=update), pairs_dir=pairs,
                         tokenizer_dir=ROOT / p.paths.tokenizer, out_dir=out,
                         work_dir=work / f"snapshots-{name}")
        return time.perf_counter() - start, stats

    return run


def phase_seconds(run, work: Path, n: int = 200) -> tuple[float, float]:
    """Seconds per curriculum (short) step and per full-length step, start-up not counted."""
    def seconds(steps: int, short: bool) -> float:
        out = work / f"timing-{steps}-{short}"
        wall = run(out, **QUIET, max_steps=steps, warmup_steps=0, short_seq_steps=steps if short else 0)[0]
        shutil.rmtree(out)
        return wall

    return tuple((seconds(n, short) - seconds(n // 4, short)) / (n - n // 4) for short in (True, False))


def budgets(presets: dict[str, Params], runs: dict, work: Path, rounds: int = 1) -> dict[str, dict]:
    """Each preset's step schedule: the first one's own, the others' time-matched to it."""
    timed = {name: [] for name in presets}
    for _ in range(rounds):  # interleaved: a busy spell of the machine hits every preset alike
        for name in presets:
            timed[name].append(phase_seconds(runs[name], work))
    first = next(iter(presets))
    c = presets[first].pretrain
    share = c.short_seq_steps / c.max_steps  # the curriculum's share of the steps

    def mean_step(name: str) -> float:
        return share * statistics.median(t[0] for t in timed[name]) + (1 - share) * statistics.median(
            t[1] for t in timed[name])

    minutes = c.max_steps * mean_step(first) / 60
    return {name: {"steps": c.max_steps if name == first else round(minutes * 60 / mean_step(name)),
                   "mean_step_s": mean_step(name), "timed": timed[name], "minutes_estimated": minutes}
            for name in presets}


def schedule(presets: dict[str, Params], steps: dict[str, int]) -> dict[str, dict]:
    """The pretrain overrides that give each preset `steps` with the first preset's shares."""
    c = next(iter(presets.values())).pretrain
    return {name: {"max_steps": n, "short_seq_steps": round(n * c.short_seq_steps / c.max_steps),
                   "warmup_steps": round(n * c.warmup_steps / c.max_steps),
                   "val_every_steps": max(1, round(n * c.val_every_steps / c.max_steps)),
                   "snapshot_every_steps": 500, "max_minutes": 0.0}  # a stopped run resumes
            for name, n in steps.items()}


def table(results: list[dict]) -> list[str]:
    """One row per encoder, then each preset's mean over its pretraining seeds."""
    head = ["| preset | pretraining seed | steps | held-out MLM acc | " + " | ".join(PROBE) +
            " | mean | fine-tuning seeds' std |", "|---" * (6 + len(PROBE)) + "|"]
    rows, by_preset = [], {}
    for r in results:
        q = r["probe"]
        by_preset.setdefault(r["preset"], []).append(r)
        rows.append(f"| {r['preset']} | {r['seed']} | {r['steps']:,} | {r['mlm_accuracy']:.3f} | " +
                    " | ".join(f"{q[t]['val_metric'] * 100:.1f}" for t in PROBE) +
                    f" | {q['mean'] * 100:.2f} | {(q['mean_std'] or 0) * 100:.2f} |")
    for preset, rs in by_preset.items():
        means = [r["probe"]["mean"] * 100 for r in rs]
        spread = f"pretraining seeds: range {max(means) - min(means):.2f}" if len(rs) > 1 else "one seed"
        task_means = " | ".join(f"{statistics.mean(r['probe'][t]['val_metric'] for r in rs) * 100:.1f}"
                                for t in PROBE)
        rows.append(f"| **{preset}** | mean of {len(rs)} | | | {task_means} | "
                    f"**{statistics.mean(means):.2f}** | {spread} |")
    return head + rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=DEFAULT_PRESETS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 43], help="pretraining seeds")
    parser.add_argument("--probe-seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertflow-arch-probe"))
    parser.add_argument("--steps", nargs="*", default=[], metavar="PRESET=N",
                        help="a preset's step count (a recorded budget) instead of timing it")
    parser.add_argument("--encoder", nargs="*", default=[], metavar="PRESET:SEED=DIR",
                        help="an encoder already trained as that preset and seed at its budget")
    parser.add_argument("--report", action="store_true",
                        help="only write RESULTS.md's section from the records in --workdir so far")
    parser.add_argument("--title", help="the RESULTS.md section's title (without '## ')")
    args = parser.parse_args()
    work = args.workdir
    if args.report:
        records = [work / f"{Path(n).stem}-s{s}.json" for s in args.seeds for n in args.presets]
        results = [json.loads(r.read_text()) for r in records if r.exists()]
        missing = [r.stem for r in records if not r.exists()]
        write_section(section(args, {r["preset"]: r["steps"] for r in results}, results, missing))
        return
    work.mkdir(parents=True, exist_ok=True)
    presets = {name: load_params(ROOT / name) for name in args.presets}
    runs = {name: trainer(p, work, Path(name).stem) for name, p in presets.items()}
    steps = dict(s.split("=") for s in args.steps)
    timing = {}
    if set(presets) - set(steps) - {args.presets[0]}:
        timing = budgets(presets, runs, work)
        print(json.dumps(timing), flush=True)
    steps = {name: int(steps.get(name, timing.get(name, {}).get("steps", p.pretrain.max_steps)))
             for name, p in presets.items()}
    given = {key: Path(d) for key, d in (e.split("=") for e in args.encoder)}
    results = []
    for seed in args.seeds:
        for name, p in presets.items():
            out = given.get(f"{name}:{seed}") or work / f"{Path(name).stem}-s{seed}"
            record = work / f"{Path(name).stem}-s{seed}.json"
            if record.exists():
                results.append(json.loads(record.read_text()))
                continue
            if out not in given.values():
                wall, stats = runs[name](out, seed=seed, **schedule(presets, steps)[name])
            else:
                wall, stats = 0.0, json.loads((out / "bertflow.json").read_text())["stats"]
            began = time.perf_counter()
            scores = probe(out, p.finetune.tasks, p.finetune, ROOT / p.paths.tasks, work / "probe" / out.name,
                           args.probe_seeds)
            r = {"preset": name, "seed": seed, "steps": steps[name], "pretrain_minutes": wall / 60,
                 "measured": measured(),  # where it ran: --report may write the section elsewhere
                 "probe_minutes": (time.perf_counter() - began) / 60, "timing": timing.get(name),
                 "mlm_accuracy": stats["mlm_accuracy"], "probe": scores}
            record.write_text(json.dumps(r, indent=1))
            results.append(r)
            print(f"{name} seed {seed}: probe mean {scores['mean']:.4f}", flush=True)
    text = section(args, steps, results, [])
    print(text)
    write_section(text)


def section(args: argparse.Namespace, steps: dict[str, int], results: list[dict], missing: list[str]) -> str:
    """RESULTS.md's section: how to reproduce, what was run, the table (and what is still to run)."""
    # Other presets get a section of their own: write_section replaces a section by its title.
    timed = any(r.get("timing") for r in results)
    title = "## " + args.title if args.title else SECTION if args.presets == DEFAULT_PRESETS else (
        "## The transfer probe" + (", time-matched: " if timed else ": ") + " against ".join(args.presets))
    machines = list(dict.fromkeys(r["measured"] for r in results if "measured" in r)) or [measured()]
    return "\n".join([
        title, "", *machines, "",
        "Reproduce: `python -m benchmarks.experiments.arch_probe --presets " + " ".join(args.presets) +
        " --seeds " + " ".join(map(str, args.seeds)) +
        " --steps " + " ".join(f"{n}={s}" for n, s in steps.items()) + "` (on the machine named above).", "",
        f"Each preset pretrained with {len(args.seeds)} seed{'s' * (len(args.seeds) > 1)} "
        f"({', '.join(map(str, args.seeds))}); "
        f"each encoder fine-tuned by the transfer probe with {len(args.probe_seeds)} seeds, "
        "validation splits (test never read). Steps: " +
        ("the first preset's own budget; the others the steps that take the same minutes on this "
         "machine, timed side by side. " if timed else "as given, the same for every seed. ") +
        "Held-out MLM accuracy is at each preset's own masking rate, so it does not compare across "
        "presets.", "",
        *table(results), "",
        *([f"Not run yet: {', '.join(missing)}. One pretraining seed per preset is no finding: the "
           "spread between two pretraining runs of one recipe is what a lead must clear.", ""]
          if missing else ["One pretraining seed per preset is no finding: the spread between two "
                           "pretraining runs of one recipe is what a lead must clear.", ""]
          if len(args.seeds) < 2 else [verdict(results), ""])])


def verdict(results: list[dict]) -> str:
    """Which preset leads on the probe mean, and whether the lead clears the spread: the larger
    range between one preset's pretraining seeds, and the best seed of the others."""
    means: dict[str, list[float]] = {}
    for r in results:
        means.setdefault(r["preset"], []).append(r["probe"]["mean"] * 100)
    ranked = sorted(means, key=lambda n: -statistics.mean(means[n]))
    best, rest = ranked[0], ranked[1:]
    lead = statistics.mean(means[best]) - max(statistics.mean(means[n]) for n in rest)
    spread = max(max(v) - min(v) for v in means.values())
    clears = lead > spread and min(means[best]) > max(max(means[n]) for n in rest)
    return (f"**{best}** leads by {lead:.2f} points on the probe mean; the larger range between one "
            f"preset's pretraining seeds is {spread:.2f}"
            + (", and its worst seed is above every other preset's best: a finding." if clears
               else ": within the spread, no finding."))


if __name__ == "__main__":
    main()
