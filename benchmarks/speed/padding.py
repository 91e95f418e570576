"""What share of the tokens a pretraining batch computes are padding: the classic recipe's NSP pairs
(Google's target lengths, 10% of them short), whole sentences packed (pairs.mode packing,
RoBERTa's) and the documents' tokens streamed into full rows (stream, as params.yaml
trains), from the same clean corpus and tokenizer.

Both are built here in a temporary folder by the pairs stage's own code, then streamed as the
pretrain stage streams them (PairBatches: each batch padded to its longest row).

Usage:  python -m benchmarks.speed.padding [--batches 200]   (after `bertflow run --until tokenizer`)
Writes the "Padding in pretraining batches" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.data.pairs import make_pairs
from components.model.masking import Masker
from components.training.pretrain_data import PairBatches, masking_spec

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Padding in pretraining batches"


def padding_share(pairs_dir: Path, batch_size: int, masker: Masker, batches: int) -> tuple[float, float]:
    """Share of padding among the positions of `batches` batches, and the mean real length."""
    real = total = rows = 0
    stream = PairBatches(pairs_dir / "train", batch_size, masker, seed=0)
    for batch in itertools.islice(iter(stream), batches):
        mask = batch["attention_mask"]
        real, total, rows = real + int(mask.sum()), total + mask.numel(), rows + mask.shape[0]
    return 1 - real / total, real / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    p = load_params(ROOT / "params.yaml")
    clean, tokenizer = ROOT / p.paths.clean, ROOT / p.paths.tokenizer
    masker = Masker(masking_spec(p.pretrain, tokenizer))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("nsp", "packing", "stream"):
            pairs = p.pairs.model_copy(update={"mode": mode})
            make_pairs(pairs, p.executor, clean, tokenizer, Path(tmp) / mode)
            share, length = padding_share(Path(tmp) / mode, p.pretrain.batch_size, masker, args.batches)
            rows.append(f"| {mode} | {length:.1f} | **{share:.1%}** |")
            print(rows[-1], flush=True)
    text = "\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.padding --batches {args.batches}` (the default corpus and "
        f"tokenizer; batch {p.pretrain.batch_size}, pairs.max_seq_len {p.pairs.max_seq_len}).",
        "",
        "| pairs.mode | real tokens per row | padding share of the computed positions |",
        "|---|---|---|",
        *rows,
        "",
        "`packing` keeps sentences whole, so a row ends short by part of the sentence that does "
        "not fit; `stream` rows are full but for a shard's last one. With "
        "`pretrain.packed_attention: within` the documents in a row attend only within themselves.",
        "",
    ])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
