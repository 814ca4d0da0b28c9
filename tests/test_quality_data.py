"""More data without leakage (phrase sub-entries, split by dictionary entry) and
BPE-dropout on the training side, reproducible per (seed, epoch)."""
import subprocess
import sys

import pytest

from minitf.nmt import corpora as ding
from minitf.nmt.data import Corpus, read_splits
from minitf.nmt.tokenizer import BpeDropout
from minitf.nmt.tokenizer import train_tokenizer
from minitf.nmt.train import main as train_main
from tests.runs import ROOT, TINY, metrics

LINES = [
    "blank {adj} | aus reiner Bosheit | Es war purer Zufall. :: sheer | from sheer malice | It was sheer coincidence.",
    "Nachbar {m} | ohne Gegenüber | freundliche Nachbarn :: neighbour | with no neighbours/neighbors opposite | "
    "friendly neighbours",
    "jdm. etw. geben | etw. zurückgeben :: to give sb. sth. | to give sth. back",
    "Entladen {n} | Entladen eines Containers :: stripping | stripping / unstuffing of a container",
] + [f"Wort{i} | Das ist Satz {i}. | kleine Phrase {i} :: word{i} | That is sentence {i}. | small phrase {i}"
     for i in range(40)]


@pytest.fixture
def entries(tmp_path):
    path = tmp_path / "de-en"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return ding.parse_ding_entries(path)


def test_phrases_are_extracted_and_cleaned(entries):
    phrases = [pair for _, _, p in entries for pair in p]
    assert ("aus reiner Bosheit", "from sheer malice") in phrases
    assert ("ohne Gegenüber", "with no neighbours opposite") in phrases  # a/b: the first
    assert ("freundliche Nachbarn", "friendly neighbours") in phrases
    assert not any("etw" in de or "sth" in en for de, en in phrases)     # placeholders
    assert not any("/" in de + en or "{" in de + en for de, en in phrases)
    assert not any(de.startswith("Entladen eines") for de, _ in phrases)  # spaced alternatives: skipped
    sentences = [pair for _, s, _ in entries for pair in s]
    assert ("Es war purer Zufall.", "It was sheer coincidence.") in sentences


def test_split_by_entry_holds_out_whole_lines(entries):
    split = ding.split_by_entry(entries, seed=3, n_valid=5, n_test=5)
    sentences = [pair for _, s, _ in entries for pair in s]
    _, valid, test = ding.split_pairs(sentences, seed=3, n_valid=5, n_test=5)
    assert split["valid"] == valid and split["test"] == test  # the same held-out sentences as before
    held_lines = [(s, p) for _, s, p in entries if set(s) & set(valid + test)]
    assert len(held_lines) == 10
    train = set(split["train_sentences"]) | set(split["train_phrases"])
    for line_sentences, line_phrases in held_lines:  # nothing of a held-out entry reaches training
        assert not train & set(line_sentences + line_phrases)
    assert len(split["train_phrases"]) == 3 + 30 and len(split["train_sentences"]) == 31
    assert split["stats"]["held_out_lines"] == 10


def test_default_splits_write_both_training_sets(tmp_path, monkeypatch):
    dictionary = tmp_path / "trans-de-en" / "usr/share/trans/de-en"
    dictionary.parent.mkdir(parents=True)
    dictionary.write_text("\n".join(LINES * 30) + "\n", encoding="utf-8")
    original = ding.split_by_entry
    monkeypatch.setattr(ding, "split_by_entry", lambda e, seed: original(e, seed=seed, n_valid=3, n_test=3))
    paths = ding.default_corpus_splits(tmp_path, phrases=True)
    folder = tmp_path / ding.SPLIT_FOLDER
    assert paths["train_src"] == str(folder / "train.de")
    assert ding.default_corpus_splits(tmp_path)["train_src"] == str(folder / "train-sentences.de")
    n_all = len((folder / "train.de").read_text(encoding="utf-8").splitlines())
    n_sentences = len((folder / "train-sentences.de").read_text(encoding="utf-8").splitlines())
    assert n_all > n_sentences > 0


# --------------------------------------------------------------------------- BPE-dropout

TEXTS = [f"Die kleine Katze sieht {i} rote Vögel und einen Hund." for i in range(60)] + \
        [f"Mehrere ungewöhnliche Zusammensetzungen {i}." for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(TEXTS, tmp_path_factory.mktemp("tok") / "t.model", 120)


def test_p_zero_is_the_tokenizers_own_segmentation(tokenizer):
    assert BpeDropout(tokenizer, TEXTS, 0.0).sample(1, 0) == tokenizer.encode(TEXTS)


def test_samples_depend_only_on_seed_and_epoch(tokenizer):
    sampler = BpeDropout(tokenizer, TEXTS, 0.2)
    a = sampler.sample(1, 0)
    assert a == sampler.sample(1, 0) and a != sampler.sample(1, 1) and a != sampler.sample(2, 0)
    assert a != tokenizer.encode(TEXTS)
    assert tokenizer.decode(a) == TEXTS  # only the segmentation changes, never the text
    assert sum(map(len, a)) > sum(map(len, tokenizer.encode(TEXTS)))  # smaller pieces


def test_samples_are_the_same_in_another_process(tokenizer, tmp_path):
    """The reason for not using sentencepiece's sampling: its samples differ between processes."""
    model = tmp_path / "t.model"
    model.write_bytes(tokenizer.model_bytes())
    code = ("import sys; from minitf.nmt.tokenizer import Tokenizer; from minitf.nmt.tokenizer import BpeDropout; "
            "from tests.test_quality_data import TEXTS; "
            "print(BpeDropout(Tokenizer(sys.argv[1]), TEXTS, 0.2).sample(5, 3))")
    other = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True, cwd=ROOT,
                           check=True).stdout.strip()
    assert other == str(BpeDropout(tokenizer, TEXTS, 0.2).sample(5, 3))


def test_only_the_training_split_is_sampled(tokenizer, tmp_path):
    paths = {}
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            path = tmp_path / f"{split}.{side}"
            path.write_text("\n".join(TEXTS[:40]) + "\n", encoding="utf-8")
            paths[f"{split}_{side}"] = str(path)
    corpus = Corpus(tokenizer, read_splits(paths), log=print)
    deterministic = corpus.ids["train"]
    corpus.set_bpe_dropout(0.3)
    corpus.start_epoch(1, 0)
    assert corpus.ids["train"] != deterministic
    assert corpus.ids["valid"] == corpus.ids["test"] == deterministic


def test_resume_with_bpe_dropout_is_exact(tmp_path, corpus):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = corpus + TINY + ["--eval-every", "100", "--save-every", "7", "--average", "0", "--bpe-dropout", "0.2",
              "--max-tokens", "400"]
    assert train_main(common + ["--max-steps", "28", "--out", str(straight)]) == 0
    assert train_main(common + ["--max-steps", "14", "--out", str(split)]) == 0
    assert train_main(["--resume", str(split), "--max-steps", "28", "--no-progress"]) == 0
    a = {r["step"]: r["loss"] for r in metrics(straight)}
    assert a == {r["step"]: r["loss"] for r in metrics(split)} and len(a) == 28
    assert max(r["epoch"] for r in metrics(straight)) >= 2  # an epoch boundary was crossed after the resume


def test_pairs_longer_than_max_len_are_skipped_with_a_message(tmp_path, corpus, capsys):
    assert train_main(corpus + TINY + ["--max-steps", "3", "--max-len", "25", "--eval-every", "100",
                                       "--out", str(tmp_path / "run")]) == 0
    assert "sentence pairs longer than --max-len 25" in capsys.readouterr().err
    assert train_main(corpus + TINY + ["--max-steps", "3", "--max-len", "1", "--out", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "train.py: error: every training pair is longer than --max-len 1 tokens; raise --max-len"

