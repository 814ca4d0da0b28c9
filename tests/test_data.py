"""Tests of the host-side data pipeline: Ding parsing (sentences and phrases, split by
entry), reading, splitting, batching, padding, the sentencepiece tokenizer and
BPE-dropout. All data is made here (no network, no apt)."""
import pathlib
import pickle
import random
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from minitf.nmt import corpora as ding, data
from minitf.training import text, tokenizer
from minitf.backend import host as np
from minitf.training.errors import DataError
from minitf.nmt.data import Corpus, read_splits
from minitf.training.tokenizer import BpeDropout, train_tokenizer
from tests.runs import ROOT

# --------------------------------------------------------------------------- parse Ding

DING_SAMPLE = """\
# Version :: devel 2023-01-30
# Comment line :: must be ignored. Totally ignored here.
Freiberufler {m}; Freischaffender {m}; freier Mitarbeiter (als Beruf) | freiberuflich tätig sein | Er entschloss sich, freiberuflich tätig zu sein. :: freelance worker; freelancer; freelance | to work as a freelance | He decided to go freelance.
Hund {m} | Der Hund bellt laut. [ugs.] :: dog | The dog barks loudly. [coll.]
Katze {f} | Die Katze schläft. | Sie mag die Katze. :: cat | The cat is sleeping.
jdm. etw. geben | Er gab ihm etw. zurück. :: to give sb. sth. | He gave sth. back to him.
Ding | Das ist ein Ding. :: thing | That is sb's thing.
Warten | Wir warten noch … :: waiting | We are still waiting …
Rat | Hör auf meinen Rat! :: advice | Listen to my advice!
Frage | Kommst du morgen (am Dienstag) mit? :: question | Are you coming along tomorrow (on Tuesday)?
Sätze | Das ist gut.; Das ist schön. :: sentences | That is good.; That is nice.
Mehr | Das ist toll.; Das ist prima. :: more | That is great.
Zwei | Sie kam gestern.; Sie kam heute. :: two | She came yesterday.; She came today.; She came now.
Klein | der kleine Hund bellt. :: small | the little dog barks.
Kurz | Gut gemacht. :: short | Well done.
Ohne Punkt | Das ist ohne Punkt :: no full stop | That has no full stop
Hund {m} | Der Hund bellt laut. [ugs.] :: dog | The dog barks loudly. [coll.]
Tier | Der Hund bellt laut. :: animal | The dog barks very loudly.
kein Trenner hier
"""


@pytest.fixture
def ding_pairs(tmp_path):
    path = tmp_path / "de-en"
    path.write_text(DING_SAMPLE, encoding="utf-8")
    return ding.unique_sentences(ding.parse_ding_entries(path))


def test_ding_sentences_keep_whole_sentences_in_order(ding_pairs):
    assert ding_pairs == [
        ("Er entschloss sich, freiberuflich tätig zu sein.", "He decided to go freelance."),
        ("Der Hund bellt laut.", "The dog barks loudly."),
        ("Hör auf meinen Rat!", "Listen to my advice!"),
        ("Kommst du morgen mit?", "Are you coming along tomorrow?"),
        ("Das ist gut.", "That is good."),
        ("Das ist schön.", "That is nice."),
        ("Das ist toll.", "That is great."),    # several synonyms against one: the first
        ("Der Hund bellt laut.", "The dog barks very loudly."),
    ]


@pytest.mark.parametrize("fragment", [
    "Die Katze schläft",      # line with different sub-entry counts on each side
    "Er gab ihm",             # placeholders etw./sth.
    "Das ist ein Ding",       # sb's
    "Wir warten noch",        # ellipsis
    "Das ist prima",          # only the first synonym pairs with a single translation
    "Sie kam",                # synonym counts differ (2 vs 3): ambiguous, skipped
    "der kleine Hund",        # lowercase start
    "Gut gemacht",            # fewer than 3 words
    "ohne Punkt",             # no final punctuation
    "Version",                # comment
])
def test_ding_sentences_reject(ding_pairs, fragment):
    assert not any(fragment in de for de, _ in ding_pairs)


def test_ding_sentences_strip_annotations_and_deduplicates(ding_pairs):
    text = " ".join(de + " " + en for de, en in ding_pairs)
    for marker in ("{", "[", "(", "  "):
        assert marker not in text
    assert ding_pairs.count(("Der Hund bellt laut.", "The dog barks loudly.")) == 1


def test_ding_bad_file_is_data_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        ding.parse_ding_entries(tmp_path / "missing")


# --------------------------------------------------------------------------- split

def test_split_is_deterministic_and_disjoint():
    pairs = [(f"s{i}", f"t{i}") for i in range(100)]
    train, valid, test = ding.split_pairs(pairs, seed=7, n_valid=10, n_test=15)
    assert (len(train), len(valid), len(test)) == (75, 10, 15)
    assert sorted(train + valid + test) == sorted(pairs)
    assert (train, valid, test) == ding.split_pairs(pairs, seed=7, n_valid=10, n_test=15)
    assert ding.split_pairs(pairs, seed=8, n_valid=10, n_test=15)[1] != valid
    assert pairs == [(f"s{i}", f"t{i}") for i in range(100)]  # input untouched


def test_split_too_small_corpus():
    with pytest.raises(DataError, match="cannot hold out"):
        ding.split_pairs([("a", "b")] * 5, n_valid=3, n_test=3)


# --------------------------------------------------------------------------- read / write

def _write(path, content):
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def test_read_parallel_ok_drops_empty_sides(tmp_path):
    src = _write(tmp_path / "src", "\ufeffein Satz\r\n\nzwei  \ndrei\n")
    tgt = _write(tmp_path / "tgt", "one sentence\nnone\n\nthree")
    pairs = data.read_parallel(src, tgt)
    assert list(pairs) == [("ein Satz", "one sentence"), ("drei", "three")]
    assert pairs.n_dropped == 2


def test_read_lines_splits_on_newline_only(tmp_path):
    # \u2028 and \x0c are line breaks for str.splitlines but not for wc -l.
    path = _write(tmp_path / "f", "a\u2028b\nc\x0cd\n")
    assert text.read_lines(path, "source") == ["a\u2028b", "c\x0cd"]


@pytest.mark.parametrize("case, pattern", [
    ("missing", "does not exist"),
    ("directory", "is a directory"),
    ("empty", "is empty"),
    ("blank", "only empty lines"),
    ("latin1", "not valid UTF-8 at line 2"),
    ("long", "line 3 has 11 characters"),
    ("mismatch", "has 3 lines but target .* has 2"),
])
def test_read_parallel_errors(tmp_path, case, pattern):
    src = _write(tmp_path / "src", "a\nb\nc\n")
    tgt = tmp_path / "tgt"
    if case == "missing":
        pass
    elif case == "directory":
        tgt.mkdir()
    elif case == "empty":
        _write(tgt, b"")
    elif case == "blank":
        _write(tgt, "\n  \n\n")
    elif case == "latin1":
        _write(tgt, "x\nSch\xf6n\n".encode("latin-1"))
    elif case == "long":
        _write(tgt, "x\ny\n" + "z" * 11 + "\n")
    elif case == "mismatch":
        _write(tgt, "x\ny\n")
    with pytest.raises(DataError, match=pattern) as info:
        data.read_parallel(src, tgt, max_chars=10)
    message = str(info.value)
    assert "\n" not in message and "target" in message


def test_write_lines_round_trip_and_atomic(tmp_path):
    path = tmp_path / "sub" / "out.txt"
    text.write_lines(path, ["eins", "zwei ü"])
    assert text.read_lines(path, "x") == ["eins", "zwei ü"]
    with pytest.raises(DataError, match="newline"):
        text.write_lines(path, ["ok", "bad\nline"])
    assert text.read_lines(path, "x") == ["eins", "zwei ü"]  # old content kept
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.txt"]  # no temp left


# --------------------------------------------------------------------------- batching

def _check_batches(src, tgt, max_tokens, max_len, batches, n_skipped):
    allowed = [i for i in range(len(src)) if max_len is None or max(src[i], tgt[i]) <= max_len]
    seen = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    assert sorted(seen.tolist()) == allowed
    assert n_skipped == len(src) - len(allowed)
    for batch in batches:
        assert batch.dtype == np.int64
        if len(batch) > 1:
            assert max(src[i] for i in batch) * len(batch) <= max_tokens
            assert max(tgt[i] for i in batch) * len(batch) <= max_tokens


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), max_size=60),
       st.integers(1, 200), st.one_of(st.none(), st.integers(1, 40)), st.integers(0, 99))
def test_token_batches_properties(lengths, max_tokens, max_len, seed):
    src = [s for s, _ in lengths]
    tgt = [t for _, t in lengths]
    batches, n_skipped = data.token_batches(src, tgt, max_tokens, seed, 0, max_len=max_len)
    _check_batches(src, tgt, max_tokens, max_len, batches, n_skipped)


def test_token_batches_deterministic_and_epoch_dependent():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 50, 2000), rng.integers(1, 50, 2000)
    first, _ = data.token_batches(src, tgt, 500, seed=3, epoch=1, max_len=45)
    again, _ = data.token_batches(src, tgt, 500, seed=3, epoch=1, max_len=45)
    other, _ = data.token_batches(src, tgt, 500, seed=3, epoch=2, max_len=45)
    assert [b.tolist() for b in first] == [b.tolist() for b in again]
    assert [b.tolist() for b in first] != [b.tolist() for b in other]
    _, n_skipped = data.token_batches(src, tgt, 500, seed=3, epoch=1, max_len=45)
    _check_batches(src.tolist(), tgt.tolist(), 500, 45, first, n_skipped)
    # batches are length-homogeneous: sorted by source length before cutting
    spans = [src[b].max() - src[b].min() for b in first]
    assert np.mean(spans) <= 2


def test_token_batches_oversize_sentence_alone():
    # 100 tokens > budget 7: alone; 3 and 4 together would pad to 2 * 4 = 8 > 7
    batches, skipped = data.token_batches([3, 100, 4], [3, 5, 4], max_tokens=7, seed=0, epoch=0)
    assert skipped == 0
    assert sorted(b.tolist() for b in batches) == [[0], [1], [2]]
    batches, _ = data.token_batches([3, 100, 3], [3, 5, 3], max_tokens=7, seed=0, epoch=0)
    assert sorted(sorted(b.tolist()) for b in batches) == [[0, 2], [1]]


def test_token_batches_on_a_large_corpus_cover_every_sentence_once():
    # (how fast it is belongs in benchmarks/, not in a test that a busy machine makes flaky)
    rng = np.random.default_rng(1)
    src, tgt = rng.integers(3, 60, 20_000), rng.integers(3, 60, 20_000)
    batches, skipped = data.token_batches(src, tgt, 4096, seed=0, epoch=0, max_len=100)
    _check_batches(src.tolist(), tgt.tolist(), 4096, 100, batches, skipped)


def test_token_batches_bad_budget():
    with pytest.raises(DataError, match="max_tokens"):
        data.token_batches([1], [1], 0, 0, 0)


# --------------------------------------------------------------------------- padding

def test_pad_batch():
    out = data.pad_batch([[5, 6, 7], [8]], pad_id=0, bos_id=2, eos_id=3)
    assert out.dtype == np.int64 and out.shape == (2, 5)
    assert out.tolist() == [[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]]
    assert data.pad_batch([np.array([4, 4]), [9]], pad_id=0).tolist() == [[4, 4], [9, 0]]


def test_make_target_io():
    tgt_in, tgt_out = data.make_target_io([[5, 6, 7], [8]], pad_id=0, bos_id=2, eos_id=3)
    assert tgt_in.shape == tgt_out.shape == (2, 4)
    assert tgt_in.tolist() == [[2, 5, 6, 7], [2, 8, 0, 0]]
    assert tgt_out.tolist() == [[5, 6, 7, 3], [8, 3, 0, 0]]


# --------------------------------------------------------------------------- tokenizer

def _synthetic_corpus(n=300):
    rnd = random.Random(0)
    de = "der die das Hund Katze sitzt auf dem Tisch schläft gern und läuft schnell".split()
    en = "the dog cat sits on table sleeps likes to and runs fast happily".split()
    return [" ".join(rnd.choice(words) for _ in range(rnd.randint(3, 8))).capitalize() + "."
            for words in (de, en) for _ in range(n // 2)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "bpe.model"
    return tokenizer.train_tokenizer(_synthetic_corpus(), path, vocab_size=100, seed=0), path


def test_tokenizer_ids_and_round_trip(trained):
    tok, path = trained
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert (tokenizer.PAD_ID, tokenizer.UNK_ID, tokenizer.BOS_ID, tokenizer.EOS_ID) == (0, 1, 2, 3)
    assert tok.vocab_size == 100
    texts = ["Der Hund schläft gern.", "The cat runs fast."]
    ids = tok.encode(texts)
    assert all(isinstance(i, int) and 4 <= i < 100 for seq in ids for i in seq)
    assert tok.decode(ids) == texts
    loaded = tokenizer.Tokenizer(path)
    assert loaded.encode(texts) == ids and loaded.sha256 == tok.sha256
    assert tok.encode(["Zebra"])[0].count(tokenizer.UNK_ID) >= 1  # 'Z' never seen


def test_tokenizer_decode_cuts_at_eos_and_skips_pad_bos(trained):
    tok, _ = trained
    ids = tok.encode(["Der Hund sitzt."])[0]
    garbage = tok.encode(["Katze"])[0]
    rows = [[tok.bos_id] + ids + [tok.eos_id] + garbage,  # text after EOS is ignored
            [tok.bos_id] + ids[:2] + [tok.pad_id] * 3,     # no EOS: padding is dropped
            [tok.eos_id] + ids]                              # EOS first: empty text
    assert tok.decode(rows) == ["Der Hund sitzt.", tok.decode([ids[:2]])[0], ""]
    assert tok.decode(np.array(rows[1:2])) == tok.decode([ids[:2]])


def test_tokenizer_from_bytes_and_pickle(trained):
    tok, _ = trained
    copy = tokenizer.Tokenizer.from_bytes(tok.model_bytes())
    assert copy.sha256 == tok.sha256 and copy.vocab_size == tok.vocab_size
    assert copy.encode(["Die Katze läuft."]) == tok.encode(["Die Katze läuft."])
    assert pickle.loads(pickle.dumps(tok)).sha256 == tok.sha256


def test_tokenizer_vocab_too_large(tmp_path):
    with pytest.raises(DataError, match=r"at most \d+; lower --vocab-size"):
        tokenizer.train_tokenizer(_synthetic_corpus(40), tmp_path / "big.model", vocab_size=5000)
    assert not (tmp_path / "big.model").exists()


@pytest.mark.parametrize("content, pattern", [
    (None, "does not exist"), (b"", "empty"), (b"garbage\x00\x01", "corrupt")])
def test_tokenizer_bad_model_file(tmp_path, content, pattern):
    path = tmp_path / "m.model"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=pattern):
        tokenizer.Tokenizer(path)


def test_tokenizer_no_text(tmp_path):
    with pytest.raises(DataError, match="no text"):
        tokenizer.train_tokenizer(["", "  "], tmp_path / "m.model", vocab_size=50)


# --------------------------------------------------------------------------- Ding phrases, split by dictionary entry
# More data without leakage: phrase sub-entries are extracted and cleaned, and the
# held-out sentences take their whole dictionary line with them.
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
    """Ding lines with phrase sub-entries, parsed."""
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


def test_the_lexicon_holds_headwords_and_phrases_and_nothing_held_out(entries):
    split = ding.split_by_entry(entries, seed=3, n_valid=5, n_test=5)
    lexicon = set(split["train_lexicon"])
    assert set(split["train_phrases"]) < lexicon  # --phrases: the lexicon's pairs of 2+ words a side
    assert all(len(de.split()) >= 2 and len(en.split()) >= 2 for de, en in split["train_phrases"])
    assert ("blank", "sheer") in lexicon and ("Nachbar", "neighbour") in lexicon  # headword translations
    held = set(split["valid"] + split["test"])
    for _, line_sentences, line_lexicon in entries:
        if held & set(line_sentences):  # a held-out sentence's line gives nothing to the lexicon either
            assert not lexicon & set(line_lexicon)
    assert not lexicon & set(split["train_sentences"])
    assert split["stats"]["train_lexicon"] == len(split["train_lexicon"])


def _lexicon_corpus(bpe_tokenizer, tmp_path, n_sentences=40, n_lexicon=30):
    texts = {"train": TEXTS[:n_sentences], "valid": TEXTS[:5], "lexicon": [f"Wort {i}" for i in range(n_lexicon)]}
    paths = {}
    for split, lines in texts.items():
        for side in ("src", "tgt"):
            path = tmp_path / f"{split}.{side}"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            paths[f"{split}_{side}"] = str(path)
    return Corpus(bpe_tokenizer, read_splits(paths), log=print)


def test_lexicon_pairs_are_a_new_sample_each_epoch_and_the_same_on_resume(bpe_tokenizer, tmp_path):
    corpus = _lexicon_corpus(bpe_tokenizer, tmp_path)
    sentences = corpus.ids["train"]
    corpus.set_lexicon(0.5)
    corpus.start_epoch(1, 0)
    src, tgt = corpus.ids["train"]
    assert len(src) == len(tgt) == 40 + 20  # 0.5 lexicon pairs per sentence
    assert (src[:40], tgt[:40]) == sentences  # the sentences themselves, first and unchanged
    lexicon_src = bpe_tokenizer.encode(corpus.text["lexicon"][0])
    epoch0 = src[40:]
    assert all(ids in lexicon_src for ids in epoch0) and len(set(map(tuple, epoch0))) == 20  # no repeats
    corpus.start_epoch(1, 1)
    assert corpus.ids["train"][0][40:] != epoch0  # another sample: the run covers the lexicon
    resumed = _lexicon_corpus(bpe_tokenizer, tmp_path)  # a resumed run builds its corpus anew
    resumed.set_lexicon(0.5)
    resumed.start_epoch(1, 0)
    assert resumed.ids["train"][0][40:] == epoch0
    big = _lexicon_corpus(bpe_tokenizer, tmp_path)
    big.set_lexicon(10)  # more asked than there is: every lexicon pair once
    big.start_epoch(1, 0)
    assert len(big.ids["train"][0]) == 40 + 30


def test_lexicon_needs_a_lexicon_split(bpe_tokenizer, tmp_path):
    paths = {f"{split}_{side}": str(tmp_path / f"{split}.{side}") for split in ("train", "valid") for side in ("src", "tgt")}
    for path in paths.values():
        pathlib.Path(path).write_text("\n".join(TEXTS[:10]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="--lexicon"):
        Corpus(bpe_tokenizer, read_splits(paths), log=print).set_lexicon(0.5)


def test_the_presets_lexicon_belongs_to_the_default_corpus(monkeypatch):
    from minitf.nmt.config import PRESETS
    from minitf.train import build_parser, config_from_args

    def lexicon(*argv):
        return config_from_args(build_parser().parse_args(list(argv))).lexicon
    assert lexicon() == 0.0  # the default run trains on sentences alone (docs/results.md, 'Recipe arms')
    assert lexicon("--lexicon", "2") == 2.0
    monkeypatch.setitem(PRESETS["tiny"], "lexicon", 0.5)  # a preset that mixes the lexicon in
    assert lexicon() == 0.5 and lexicon("--lexicon", "0") == 0.0
    assert lexicon("--train-src", "a", "--train-tgt", "b") == 0.0  # your own corpus: sentences only
    assert lexicon("--phrases") == 0.0 and lexicon("--corpus", "wmt14-en-de") == 0.0
    assert lexicon("--corpus-dir", "prepared") == 0.0 and lexicon("--preset", "base") == 0.0


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
    with_lexicon = ding.default_corpus_splits(tmp_path, lexicon=True)
    assert with_lexicon["lexicon_src"] == str(folder / "lexicon.de") and with_lexicon["lexicon_tgt"] == str(folder / "lexicon.en")
    assert "lexicon_src" not in paths
    n_all = len((folder / "train.de").read_text(encoding="utf-8").splitlines())
    n_sentences = len((folder / "train-sentences.de").read_text(encoding="utf-8").splitlines())
    n_lexicon = len((folder / "lexicon.de").read_text(encoding="utf-8").splitlines())
    assert n_lexicon > n_all - n_sentences > 0 and n_sentences > 0  # the lexicon: the phrases and headwords


# --------------------------------------------------------------------------- BPE-dropout: only the training side,
# reproducible per (seed, epoch) and across processes

TEXTS = [f"Die kleine Katze sieht {i} rote Vögel und einen Hund." for i in range(60)] + \
        [f"Mehrere ungewöhnliche Zusammensetzungen {i}." for i in range(60)]


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory):
    return train_tokenizer(TEXTS, tmp_path_factory.mktemp("tok") / "t.model", 120)


def test_p_zero_is_the_tokenizers_own_segmentation(bpe_tokenizer):
    assert BpeDropout(bpe_tokenizer, TEXTS, 0.0).sample(1, 0) == bpe_tokenizer.encode(TEXTS)


def test_samples_depend_only_on_seed_and_epoch(bpe_tokenizer):
    sampler = BpeDropout(bpe_tokenizer, TEXTS, 0.2)
    a = sampler.sample(1, 0)
    assert a == sampler.sample(1, 0) and a != sampler.sample(1, 1) and a != sampler.sample(2, 0)
    assert a != bpe_tokenizer.encode(TEXTS)
    assert bpe_tokenizer.decode(a) == TEXTS  # only the segmentation changes, never the text
    assert sum(map(len, a)) > sum(map(len, bpe_tokenizer.encode(TEXTS)))  # smaller pieces


def test_samples_are_the_same_in_another_process(bpe_tokenizer, tmp_path):
    """The reason for not using sentencepiece's sampling: its samples differ between processes."""
    model = tmp_path / "t.model"
    model.write_bytes(bpe_tokenizer.model_bytes())
    code = ("import sys; from minitf.training.tokenizer import Tokenizer; from minitf.training.tokenizer import BpeDropout; "
            "from tests.test_data import TEXTS; "
            "print(BpeDropout(Tokenizer(sys.argv[1]), TEXTS, 0.2).sample(5, 3))")
    other = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True, cwd=ROOT,
                           check=True).stdout.strip()
    assert other == str(BpeDropout(bpe_tokenizer, TEXTS, 0.2).sample(5, 3))


def test_only_the_training_split_is_sampled(bpe_tokenizer, tmp_path):
    paths = {}
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            path = tmp_path / f"{split}.{side}"
            path.write_text("\n".join(TEXTS[:40]) + "\n", encoding="utf-8")
            paths[f"{split}_{side}"] = str(path)
    corpus = Corpus(bpe_tokenizer, read_splits(paths), log=print)
    deterministic = corpus.ids["train"]
    corpus.set_bpe_dropout(0.3)
    corpus.start_epoch(1, 0)
    assert corpus.ids["train"] != deterministic
    assert corpus.ids["valid"] == corpus.ids["test"] == deterministic
