"""GPU check, one prepared run: bf16 pretraining steps of a BERT-base-size classic and a
ModernBERT-base-size modern encoder (eager, and compiled as pretrain.compile does it) at 128 and
512 tokens against transformers' `BertForPreTraining` and `ModernBertForMaskedLM` (sdpa, bf16,
eager) on the same device, tokens/s and MFU (against the bf16 matrix-product rate measured in the
same run, and the device's nominal peak where known); two short fine-tuning fits through the
pipeline's own code (precision `auto`: bf16-mixed on CUDA); the modern export loading in
transformers with equal logits; and four fits one at a time against fanned out on a Dask cluster
of two worker processes sharing the device.

benchmarks/checks/gpu_check.sh runs it on a GPU after the bf16 probe (at most 260 s, its
timeout); `--tiny` runs the same on CPU in seconds with tiny shapes (the test suite does).

Usage:  python -m benchmarks.checks.gpu_check [--tiny] [--steps 10] [--out gpu_check.json]
        python -m benchmarks.checks.gpu_check --record gpu_check.json   (its "GPU check" RESULTS.md section)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.results import measured, write_section
from benchmarks.speed.pretrain_throughput import measure
from components.core.config import FinetuneConfig, TaskConfig
from components.core.params import load_params
from components.model.config import BertConfig
from components.training.compiling import backend_missing

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

# Dense bf16 tensor-core peaks (vendor figures, FLOP/s), by a substring of the device's name.
NOMINAL_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def encoders(tiny: bool, vocab: int) -> list[tuple[str, BertConfig]]:
    """The classic and modern shapes to time: params.yaml's base presets (tiny: its tiny one),
    BERT's post-norm block and ModernBERT's with params.yaml's model settings, plain MLM heads."""
    from components.training.pretrain import bert_config

    p = load_params(ROOT / "params.yaml")

    def of(preset: str, arch: str) -> BertConfig:
        model = p.model.model_copy(update={"preset": preset, "arch": arch, "norm": "post"})
        return replace(bert_config(model, vocab, p.pretrain), dropout=0.0, max_position=8192, sbo=False,
                       rtd=False, position_init="random")

    return [("classic", of("tiny" if tiny else "base", "classic")),
            ("modern", of("tiny" if tiny else "modern-base", "modern"))]


def pretraining_rows(device: str, tiny: bool, steps: int) -> list[dict]:
    """tokens/s and MFU of ours and transformers' per encoder and length (bf16 autocast)."""
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    nominal = next((v for k, v in NOMINAL_BF16.items() if k in name), None)
    classic, modern = encoders(tiny, vocab=512 if tiny else 30_522)
    rows = []
    # The modern step also as pretrain.compile runs it on CUDA (blocks and MLM head compiled),
    # where this machine can compile (on CPU: a C++ compiler).
    variants = [(classic, False), (modern, False)] + [(modern, True)] * (backend_missing(device) is None)
    for (arch, cfg), compiled in variants:
        for T in (32, 64) if tiny else (128, 512):
            B = (256 if tiny else 16_384) // T  # the same tokens per step at each length
            masking = 0.3 if arch == "modern" else 0.15
            r = measure(cfg, B, T, masking, bf16=True, steps=steps, device=device,
                        matmul_n=256 if tiny else 8192, compiled=compiled)
            rows.append({"encoder": arch, "compiled": compiled, "layers": cfg.layers, "hidden": cfg.hidden,
                         "tokens": T, "batch": B, "ours_tokens_s": r["ours"], "hf_tokens_s": r["hf"],
                         "ratio": r["ratio"], "mfu_measured": r["mfu"], "matmul_tflops": r["peak"] / 1e12,
                         "first_step_s": r["first_step_s"],
                         "mfu_nominal": r["flops"] * r["ours"] / (B * T) / nominal if nominal else None})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _tokenizer(texts: list[str], out: Path) -> None:
    """A small WordPiece tokenizer over `texts`, saved as the tokenizer stage saves one."""
    from components.data.tokenizer import TOKENIZER_FILE, add_template, build, transformers_files, write_vocab

    cfg = load_params(ROOT / "params.yaml").tokenizer.model_copy(update={"vocab_size": 300})
    tok, trainer = build(cfg)
    tok.train_from_iterator(texts, trainer)
    add_template(tok)
    out.mkdir(parents=True)
    tok.save(str(out / TOKENIZER_FILE))
    write_vocab(tok, out)
    transformers_files("wordpiece", cfg.lowercase, out, 512)


def finetune_and_export(tiny: bool, root: Path) -> dict:
    """Two fits (the pretrained and the scratch start, one seed each) of a modern encoder on a
    made-up review task, through the pipeline's finetune_start; then the encoder's export in
    transformers, logits compared."""
    from transformers import AutoModelForMaskedLM

    from components.data.tasks.prepare import prepare_task
    from components.model.build import build_model
    from components.model.folders import write_encoder
    from components.model.metadata import EncoderInfo
    from components.training.finetune import finetune_start

    words = ["good", "great", "fine", "awful", "poor", "dull"]
    rows = [(f"the film number {i} was {words[i % 6]} and long", "pos" if i % 6 < 3 else "neg")
            for i in range(600)]
    (root / "reviews.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    _tokenizer([t for t, _ in rows], root / "tokenizer")
    from components.data.tokenizer import load

    vocab = load(root / "tokenizer").get_vocab_size()
    _, modern = encoders(tiny, vocab)[1]
    modern = replace(modern, max_position=512, dropout=0.1)
    model = build_model(modern)
    write_encoder(model, EncoderInfo(modern), root / "tokenizer", root / "encoder")

    theirs, loading = AutoModelForMaskedLM.from_pretrained(root / "encoder", output_loading_info=True)
    ids = torch.tensor([load(root / "tokenizer").encode(rows[0][0]).ids])
    with torch.no_grad():
        ours = model.eval().mlm.logits(model.encoder(ids))
        delta = (ours - theirs.eval()(input_ids=ids).logits).abs().max().item()

    task, cfg = review_task()
    prepare_task("reviews", task, root, root / "packages", root / "task")
    began = time.perf_counter()
    fits = {}
    for init in ("pretrained", "scratch"):  # a start each, as their stages run them
        fits.update(finetune_start("reviews", task, cfg, init=init, task_dir=root / "task",
                                   encoder_dir=root / "encoder", out_dir=root / init)["fits"])
    return {"export_missing": sorted(loading["missing_keys"]),
            "export_unexpected": sorted(loading["unexpected_keys"]), "export_max_logit_delta": delta,
            "fits_seconds": time.perf_counter() - began, "fits": fits}


def review_task() -> tuple[TaskConfig, FinetuneConfig]:
    """The made-up review task at params.yaml's task settings, its first rate (no search), two
    epochs; params.yaml's fine-tuning settings, one seed, fits in this process."""
    p = load_params(ROOT / "params.yaml")
    task = TaskConfig.model_validate({**p.finetune.task_defaults.model_dump(), "kind": "classification",
                                      "source": "reviews.csv", "lr": p.finetune.task_defaults.lr[:1],
                                      "epochs": 2})
    return task, p.finetune.model_copy(update={"tasks": {"reviews": task}, "seeds": [1], "workers": 1})


def fanned_out(tiny: bool, root: Path, processes: int = 2) -> dict:
    """The review task's pretrained start (finetune_and_export's, in `root`), 2 × `processes`
    fits (tiny: one each, of the task's own 30 steps, what the test suite can afford) one at a
    time in this process, then on a Dask cluster of `processes` one-fit workers on this machine
    (with a GPU: all on its one device, each worker declaring a `GPU` the fits ask for, as
    docs/scaling.md's node): the seconds of each (the cluster started beforehand, as a
    deployment's is) and whether every fit came out the same (steps, best validation score, rate)."""
    from dask.distributed import LocalCluster

    from components.training.finetune import finetune_start
    from components.training.workers import Cluster

    task, cfg = review_task()
    cfg = cfg.model_copy(update={"seeds": list(range(1, (1 if tiny else 2) * processes + 1)),
                                 **({"min_steps": 1} if tiny else {})})
    gpu = {"GPU": 1} if torch.cuda.is_available() else {}

    def fits(out: str, cluster: Cluster | None) -> tuple[float, dict]:
        began = time.perf_counter()
        got = finetune_start("reviews", task, cfg, init="pretrained", task_dir=root / "task",
                             encoder_dir=root / "encoder", out_dir=root / out, cluster=cluster)
        return time.perf_counter() - began, got["fits"]

    here_s, here = fits("one-at-a-time", None)
    with LocalCluster(n_workers=processes, threads_per_worker=1, resources=gpu or None,
                      dashboard_address=None) as local:
        there_s, there = fits("fanned-out", Cluster(local.scheduler_address, gpu))
    return {"fits": len(here), "processes": processes, "one_at_a_time_seconds": here_s,
            "fanned_out_seconds": there_s, "same_fits": here == there}


def record(report: dict) -> str:
    """The "GPU check" section of RESULTS.md from a report this script wrote on a GPU."""
    rows = [f"| {r['encoder']}{', compiled' if r.get('compiled') else ''} ({r['layers']} × {r['hidden']}) | "
            f"{r['tokens']} × {r['batch']} | "
            f"{r['ours_tokens_s']:,.0f} | {r['hf_tokens_s']:,.0f} | **{r['ratio']:.2f}** | "
            f"{r['matmul_tflops']:,.0f} | **{r['mfu_measured']:.0%}** | "
            f"{r['mfu_nominal']:.0%} | {r.get('first_step_s', 0):.1f} |" for r in report["pretraining"]]
    f = report["finetuning"]
    tuned = (f"Fine-tuning through `finetune_start` (precision `auto`: bf16-mixed; a modern base-size "
             f"encoder, 2 fits of {f['fits']['pretrained-s1']['steps']} steps): {f['fits_seconds']:.0f} s "
             f"for both; the export loads in transformers with {len(f['export_missing'])} missing and "
             f"{len(f['export_unexpected'])} unexpected keys, logits within "
             f"{f['export_max_logit_delta']:.1e}." if f else
             f"Fine-tuning and export: not in this report ({report.get('finetuning_error', 'not run')}).")
    fan = (f or {}).get("fanned_out")
    fanned = (f"Fits fanned out on one device: the pretrained start's {fan['fits']} fits one at a time "
              f"took {fan['one_at_a_time_seconds']:.0f} s, on a Dask cluster of {fan['processes']} "
              f"worker processes {fan['fanned_out_seconds']:.0f} s "
              f"(**{fan['one_at_a_time_seconds'] / fan['fanned_out_seconds']:.2f}×**), the fits "
              f"{'the same' if fan['same_fits'] else 'NOT the same'} (steps, best validation score, "
              "rate)." if fan else None)
    return "\n".join([
        "## GPU check", "", report.get("measured", ""), "",
        "Reproduce: `bash benchmarks/checks/gpu_check.sh` on the GPU (its report, as that run wrote it: "
        "benchmarks/checks/gpu_check.json), then `python -m benchmarks.checks.gpu_check --record "
        f"benchmarks/checks/gpu_check.json`. Device: {report['device']}, torch {report['torch']}.", "",
        "bf16 autocast pretraining steps, AdamW, interleaved with transformers' twin at the same shape "
        "(`BertForPreTraining` with NSP at 15% masking; `ModernBertForMaskedLM` with sparse prediction "
        "at 30%), sdpa, median of the timed steps. MFU against the bf16 8192² matrix-product rate "
        "measured in the same run, and against the device's nominal dense bf16 peak. A step of "
        "16,384 tokens at base size is small for such a GPU. transformers' side runs eager; ours "
        "eager, and the modern one also compiled as `pretrain.compile: auto` runs it on CUDA (each "
        "block and the MLM head with its loss through `torch.compile`; its first step, compiling "
        "included, in the last column).", "",
        "| encoder | tokens × batch | ours tokens/s | transformers tokens/s | ratio | matmul TFLOP/s "
        "| MFU (measured) | MFU (nominal) | our first step (s) |",
        "|---|---|---|---|---|---|---|---|---|", *rows, "", tuned, "", *([fanned, ""] if fanned else [])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (the test suite's run)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--record", type=Path, help="write RESULTS.md's section from this report")
    args = parser.parse_args()
    if args.record:
        write_section(record(json.loads(args.record.read_text())))
        return
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "measured": measured(),
              "pretraining": pretraining_rows(device, args.tiny, args.steps), "finetuning": None}

    def save() -> None:  # after each part: what ran is kept if a later part fails or times out
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    save()
    with tempfile.TemporaryDirectory() as tmp:
        report["finetuning"] = finetune_and_export(args.tiny, Path(tmp))
        save()
        report["finetuning"]["fanned_out"] = fanned_out(args.tiny, Path(tmp))
    save()
    print(json.dumps(report["finetuning"]))


if __name__ == "__main__":
    main()
