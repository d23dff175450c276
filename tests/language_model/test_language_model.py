"""The language model task: causal attention, its job through train.py on real text, seeded generation from a
checkpoint, and the n-gram baseline it is measured against."""

from __future__ import annotations

import csv
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.utilities.model_summary import summarize

from lightning_template.engine.cli import main
from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.language_model.baseline import ngram_cross_entropy
from lightning_template.tasks.language_model.data import CharVocabulary, FortunesDataModule, split_entries
from lightning_template.tasks.language_model.model import DecoderNet, LanguageModel
from lightning_template.tasks.language_model.vocabulary import BPEVocabulary, vocabulary_from_state

from tests.conftest import ROOT, train_process

JOB = f"--config={ROOT / 'configs/language_model.yaml'}"
TINY = [
    "--model.dim=32", "--model.depth=1", "--model.num_heads=2", "--data.context=32", "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=20", "--trainer.limit_val_batches=4", "--trainer.limit_test_batches=4",
    "--trainer.log_every_n_steps=5",
]  # fmt: skip


def test_a_token_never_sees_the_tokens_after_it() -> None:
    torch.manual_seed(0)
    net = DecoderNet(vocab_size=20, max_length=16, dim=16, depth=2, num_heads=2, dropout=0.0).eval()
    tokens = torch.randint(0, 20, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 20
    before, after = net(tokens), net(changed)
    assert torch.allclose(before[0, :10], after[0, :10], atol=1e-6)  # positions 0..9: their past is the same
    assert not torch.allclose(before[0, 10:], after[0, 10:])


def test_the_split_holds_out_whole_entries_and_the_vocabulary_comes_from_training() -> None:
    entries = [f"entry {i} {'xyz' if i == 0 else ''}" for i in range(100)]
    splits = split_entries(entries, held_out=0.1, seed=0)
    assert [len(splits[s]) for s in ("train", "val", "test")] == [80, 10, 10]
    assert sorted(entry for part in splits.values() for entry in part) == sorted(entries)
    vocabulary = CharVocabulary.build(splits["train"], min_count=1)
    unseen = "q"  # in no entry
    assert vocabulary.encode(unseen) == [vocabulary.unk_id]
    assert vocabulary.stream(["ab", "c"]).tolist()[-1] == vocabulary.eos_id


def test_the_ngram_baseline_is_the_add_k_formula() -> None:
    train, held_out = torch.tensor([2, 3, 2, 3, 2]), torch.tensor([2, 3])
    # bigrams: "<eos>2", "23", "32", "23", "32" ; held-out: "<eos>2" then "23"
    p1 = (1 + 0.5) / (1 + 0.5 * 4)  # count(<eos> 2) = 1, count(<eos>) = 1
    p2 = (2 + 0.5) / (2 + 0.5 * 4)  # count(2 3) = 2, count(2 as a context) = 2 (the last 2 starts no bigram)
    assert ngram_cross_entropy(train, held_out, order=2, k=0.5, vocab_size=4) == pytest.approx(
        -(math.log(p1) + math.log(p2)) / 2
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job, tiny and short, on the real corpus: fit, then test of the best checkpoint."""
    workdir = tmp_path_factory.mktemp("lm")
    done = train_process(["fit", JOB, *TINY], workdir)
    assert "val_bpt" in done.stdout and "test_bpt:" in done.stdout
    return workdir


def _predict(workdir: Path, *flags: str, expect: int = 0) -> str:
    """train.py predict of the trained checkpoint into generated.csv; its console output."""
    checkpoint = next(workdir.glob("logs/language_model/version_0/checkpoints/last.ckpt"))
    done = train_process(
        ["predict", JOB, f"--ckpt_path={checkpoint}", "--model.max_new_tokens=30",
         f"--predictions.output_file={workdir / 'generated.csv'}", "--data.num_prompts=3", *flags],
        workdir, expect=expect,
    )  # fmt: skip
    return done.stdout + done.stderr


def _generate(workdir: Path, *flags: str) -> list[dict[str, str]]:
    _predict(workdir, *flags)
    with open(workdir / "generated.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_sampling_settings_out_of_range_are_refused_before_anything_loads(monkeypatch, capsys):
    refused = {
        "top_k": (0, "--model.top_k 0: at least 1 (null: sample among all tokens)."),
        "temperature": (-0.5, "--model.temperature -0.5: at least 0 (0: greedy, the likeliest token)."),
        "max_new_tokens": (
            -3,
            "--model.max_new_tokens -3: at least 1 (a continuation also ends where its entry ends).",
        ),
    }
    for setting, (value, message) in refused.items():
        with pytest.raises(ConfigError) as err:
            LanguageModel(**{setting: value})
        assert str(err.value) == message
    monkeypatch.setattr(sys, "argv", ["train.py", "predict", JOB, "--model.top_k=0"])  # through train.py: one line
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and f"Error: {refused['top_k'][1]}" in err and "Traceback" not in err


@pytest.mark.slow
def test_generation_from_a_checkpoint_is_the_same_for_the_same_seed(trained: Path) -> None:
    first, again = _generate(trained), _generate(trained)
    assert len(first) == 3 and first == again
    assert [row["prompt"] for row in first] == [e[:24] for e in FortunesDataModule().splits["test"][:3]]
    other_seed = _generate(trained, "--seed_everything=7")
    assert [r["generated"] for r in other_seed] != [r["generated"] for r in first]
    # A sampling flag over a checkpoint: the likeliest token each time, so no seed plays a part.
    greedy = _generate(trained, "--model.temperature=0")
    assert greedy == _generate(trained, "--model.temperature=0", "--seed_everything=7") != first


@pytest.mark.slow
def test_generation_continues_the_lines_of_a_prompts_file(trained: Path) -> None:
    prompts = trained / "prompts.txt"
    prompts.write_text("A computer\nThe cat\n", encoding="utf-8")
    rows = _generate(trained, f"--data.prompts_file={prompts}")
    assert [row["prompt"] for row in rows] == ["A computer", "The cat"]


@pytest.mark.slow
def test_prompts_come_back_as_written_and_an_empty_prompts_file_is_refused(trained: Path) -> None:
    prompts = trained / "odd.txt"
    prompts.write_text("Café au lait ☕\n\n", encoding="utf-8")  # bytes the corpus never had; a fresh start
    output = _predict(trained, f"--data.prompts_file={prompts}")
    with open(trained / "generated.csv", newline="", encoding="utf-8") as f:
        assert [row["prompt"] for row in csv.DictReader(f)] == ["Café au lait ☕", ""]
    assert "never saw in training" not in output  # byte-level subwords encode every character
    prompts.write_text("", encoding="utf-8")
    output = _predict(trained, f"--data.prompts_file={prompts}", expect=1)
    assert f"Error: --data.prompts_file {prompts}: the file is empty; write one prompt per line." in output
    assert not (trained / "generated.csv").exists()  # the earlier run's file does not pass for this one's


@pytest.mark.slow
def test_data_flags_that_the_checkpoint_fixes_are_refused_not_ignored(trained: Path) -> None:
    """The checkpoint brings its vocabulary and context: another tokenizer or context on top is refused in one line
    (the job's own values, which the checkpoint replaces, are not a choice)."""
    assert len(_generate(trained, "--data.tokenizer=bpe", "--data.context=32")) == 3  # as trained: no objection
    output = _predict(trained, "--data.tokenizer=chars", "--data.context=16", expect=1)
    assert "differs from --data.context 16 (checkpoint: 32), --data.tokenizer 'chars' (checkpoint: 'bpe')" in output
    assert "Traceback" not in output and not (trained / "generated.csv").exists()  # not the earlier run's either


@pytest.mark.slow
def test_a_checkpoint_alone_is_tested_on_its_corpus_or_on_the_folder_a_flag_names(trained: Path) -> None:
    """`test --ckpt_path <file>` with nothing else, then with the folder of its corpus given as a flag (with and
    without the job's config): the datamodule's saved vocabulary comes with the checkpoint, and the flag names the
    folder it reads, which the datamodule holds as a Path."""
    checkpoint = next(trained.glob("logs/language_model/version_0/checkpoints/last.ckpt"))
    quick = ["--trainer.limit_test_batches=2", "--trainer.logger=false", "--trainer.enable_progress_bar=false"]
    corpus = FortunesDataModule().corpus_dir
    outputs = [
        train_process(["test", f"--ckpt_path={checkpoint}", *quick, *flags], trained).stdout
        for flags in ([], [f"--data.corpus_dir={corpus}"], [JOB, f"--data.corpus_dir={corpus}"])
    ]
    bits = [re.search(r"test_bpt\s*│\s*([0-9.]+)", output) for output in outputs]
    assert all(bits) and len({found.group(1) for found in bits}) == 1, outputs


def test_a_bpe_vocabulary_round_trips_counts_characters_and_lives_in_a_checkpoint() -> None:
    entries = FortunesDataModule().splits["train"][:400]
    vocabulary = BPEVocabulary.train(entries, size=300)
    assert len(vocabulary) == 300 and vocabulary.tokens[:2] == ["<eos>", "<unk>"]
    text = "Café au lait: the fortune ☕"  # bytes the training text never had encode all the same
    assert vocabulary.decode(vocabulary.encode(text)) == text and not vocabulary.unknown(text)
    stream = vocabulary.stream(["ab cd", "ef"])
    assert stream.tolist()[-1] == vocabulary.eos_id and vocabulary.characters(stream) == len("ab cd") + len("ef") + 2
    assert len(stream) < 9  # subwords: fewer tokens than characters
    again = vocabulary_from_state(vocabulary.state())
    assert again.encode(text) == vocabulary.encode(text) and again.tokens == vocabulary.tokens
    chars = CharVocabulary.build(entries, min_count=1)
    assert vocabulary_from_state(chars.state()).tokens == chars.tokens
    assert vocabulary_from_state({"tokens": chars.tokens, "context": 64}).tokens == chars.tokens  # before tokenizers


@pytest.mark.slow
def test_the_job_over_characters_reports_bits_per_character_and_says_which_prompt_characters_it_never_saw(
    tmp_path: Path,
) -> None:
    done = train_process(["fit", JOB, *TINY, "--data.tokenizer=chars"], tmp_path)
    assert "val_bpc" in done.stdout and "test_bpc:" in done.stdout
    output = _predict(tmp_path, f"--data.prompts_file={_write(tmp_path / 'p.txt', 'Café au lait ☕')}")
    with open(tmp_path / "generated.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["prompt"] == "Café au lait ☕" and rows[0]["generated"]  # as written, not as <unk>
    assert output.count("characters the model never saw in training") == 1 and "'☕'" in output.replace("é", "")
    refused = _predict(tmp_path, "--data.tokenizer=bpe", expect=1)  # the job's value, given as a flag
    assert "--data.tokenizer 'bpe' (checkpoint: 'chars')" in refused


def _write(path: Path, text: str) -> Path:
    path.write_text(text + "\n", encoding="utf-8")
    return path


def test_the_model_summary_counts_the_flops_of_one_context() -> None:
    model = LanguageModel(vocab_size=20, max_length=16, dim=16, depth=1, num_heads=2)
    assert model.example_input_array.shape == (1, 16) and summarize(model).total_flops > 0
