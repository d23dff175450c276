"""A real text-classification dataset that needs no network: fortune cookies by topic.

Debian's `fortunes` package ships thousands of quotations, jokes and aphorisms
sorted into topic files (/usr/share/games/fortunes/computers, .../politics, ...).
This script turns chosen topics into train/val/test JSONL files (a stratified,
seeded 80/10/10 split) for `TextClassificationDataModule`:

    apt-get install fortunes      # or FORTUNES_DIR=<a folder of fortune files>
    python -m lightning_template.tasks.classification.data.fortunes data/fortunes
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from jsonargparse import ArgumentParser

from lightning_template.engine.errors import MissingFileError
from lightning_template.script_args import script_parser

# Debian's copy, or the folder FORTUNES_DIR names (macOS's Homebrew fortune, a copy of your own).
FORTUNES_DIR = Path(os.environ.get("FORTUNES_DIR") or "/usr/share/games/fortunes")
DEFAULT_TOPICS = ("computers", "food", "men-women", "politics", "science", "songs-poems", "startrek", "work")


def read_fortunes(path: Path) -> list[str]:
    """Entries of a fortune file are separated by lines holding a single '%'."""
    entries = path.read_text(encoding="utf-8", errors="replace").split("\n%\n")
    return [" ".join(entry.split()) for entry in entries if entry.strip() and entry.strip() != "%"]


def build(out_dir: Path, topics: tuple[str, ...] = DEFAULT_TOPICS, seed: int = 0) -> dict[str, int]:
    missing = [t for t in topics if not (FORTUNES_DIR / t).is_file()]
    if missing:
        raise MissingFileError(
            f"{FORTUNES_DIR}: no topic files {missing}. Install them: `apt-get install fortunes`, or set"
            " FORTUNES_DIR to a folder holding them."
        )
    splits: dict[str, list[dict[str, str]]] = {"train": [], "val": [], "test": []}
    rng = random.Random(seed)
    for topic in topics:
        texts = sorted(set(read_fortunes(FORTUNES_DIR / topic)))
        rng.shuffle(texts)
        n_val = n_test = len(texts) // 10
        for split, part in (
            ("val", texts[:n_val]),
            ("test", texts[n_val : n_val + n_test]),
            ("train", texts[n_val + n_test :]),
        ):
            splits[split] += [{"text": text, "label": topic} for text in part]
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, records in splits.items():
        rng.shuffle(records)
        with open(out_dir / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)
    return {split: len(records) for split, records in splits.items()}


def parser() -> ArgumentParser:
    """The arguments of `python -m lightning_template.tasks.classification.data.fortunes`."""
    parser = script_parser(__doc__)
    parser.add_argument("out_dir", type=str, help="Folder for train/val/test.jsonl.")
    parser.add_argument("--topics", nargs="+", default=list(DEFAULT_TOPICS), help="Fortune files, one label each.")
    return parser


def main() -> None:
    args = parser().parse_args()
    print(build(Path(args.out_dir), tuple(args.topics)))


if __name__ == "__main__":
    main()
