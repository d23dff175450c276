"""The baseline the language model has to beat: a character n-gram model with add-k smoothing, on the same split
and vocabulary as `configs/language_model.yaml` (FortunesDataModule's defaults).

    python -m lightning_template.tasks.language_model.baseline  # 5-gram, k chosen on validation
    python -m lightning_template.tasks.language_model.baseline --order 3 --k 0.1

P(c | h) = (count(h c) + k) / (count(h) + k V), h the n-1 characters before c in the stream of entries (each
ended by <eos>), V the vocabulary size; counted on the training split. Cross-entropy in nats and bits per
character, the same measure as the model's `val_loss` and `val_bpt`.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from jsonargparse import ArgumentParser

from lightning_template.script_args import script_parser
from lightning_template.tasks.language_model.data import FORTUNES_DIR, FortunesDataModule


def _text(stream: torch.Tensor) -> str:
    """Token ids as one string (a character per id): n-grams are then slices, counted fast."""
    return "".join(map(chr, stream.tolist()))


def ngram_cross_entropy(train: torch.Tensor, evaluated: torch.Tensor, order: int, k: float, vocab_size: int) -> float:
    """Mean cross-entropy (nats per token) of `evaluated` under the add-k n-gram model counted on `train`."""
    pad = chr(0) * (order - 1)  # <eos>: the stream starts as after an entry
    text, held_out = pad + _text(train), pad + _text(evaluated)
    grams = Counter(text[i : i + order] for i in range(len(text) - order + 1))
    contexts = Counter(text[i : i + order - 1] for i in range(len(text) - order + 1))
    total = 0.0
    for i in range(len(held_out) - order + 1):
        gram = held_out[i : i + order]
        total -= math.log((grams[gram] + k) / (contexts[gram[:-1]] + k * vocab_size))
    return total / (len(held_out) - order + 1)


def parser() -> ArgumentParser:
    """The arguments of `python -m lightning_template.tasks.language_model.baseline`."""
    parser = script_parser(__doc__)
    parser.add_argument("--corpus_dir", default=FORTUNES_DIR, help="The fortune files.")
    parser.add_argument("--order", type=int, default=5, help="n: the model sees n-1 characters before each one.")
    parser.add_argument("--k", type=float, nargs="+", default=[0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0],
                        help="Add-k values tried; the best on validation is also scored on test.")  # fmt: skip
    return parser


def main() -> None:
    args = parser().parse_args()
    data = FortunesDataModule(corpus_dir=args.corpus_dir)
    vocabulary = data.vocabulary
    train, val, test = (vocabulary.stream(data.splits[split]) for split in ("train", "val", "test"))
    print(f"{len(data.splits['train'])} training entries ({len(train)} tokens), vocabulary {len(vocabulary)}")
    scores = {}
    for k in args.k:
        scores[k] = ngram_cross_entropy(train, val, args.order, k, len(vocabulary))
        print(
            f"{args.order}-gram, add-k {k:g}: validation {scores[k]:.4f} nats = {scores[k] / math.log(2):.4f} bits/char"
        )
    best = min(scores, key=scores.__getitem__)
    test_score = ngram_cross_entropy(train, test, args.order, best, len(vocabulary))
    print(
        f"best k {best:g}: validation {scores[best] / math.log(2):.4f} bits/char,"
        f" test {test_score / math.log(2):.4f} bits/char ({test_score:.4f} nats)"
    )


if __name__ == "__main__":
    main()
