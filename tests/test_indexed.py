"""The prepared (memory-mapped) corpus: the same batches as the in-memory Corpus,
the cleaning rules, reuse / refusal / rebuild, and nothing half-written."""
import pathlib

import pytest

from minitf.backend import host as np
from minitf.nmt.data import Corpus, read_splits, token_batches
from minitf.nmt.errors import DataError
from minitf.nmt.data import IndexedCorpus
from minitf.nmt.prepare import CleanRules, clean_pass, prepare_corpus
from tests.runs import make_corpus

KEEP_ALL = CleanRules(max_ratio=1e9, dedup=False)


def sources_of(folder, **kwargs):
    flags = make_corpus(folder, **kwargs)
    paths = dict(zip(flags[::2], flags[1::2]))
    return {split: (paths[f"--{split}-src"], paths[f"--{split}-tgt"]) for split in ("train", "valid", "test")}


def quiet(message):
    pass


@pytest.fixture
def prepared(tmp_path):
    sources = sources_of(tmp_path, n_train=150, n_valid=10)
    out = prepare_corpus(tmp_path / "prepared", sources, vocab_size=40, sample_sentences=200, workers=0,
                         rules=KEEP_ALL, log=quiet)
    return sources, IndexedCorpus(out)


def test_memory_map_gives_the_in_memory_corpus_batches(prepared):
    sources, corpus = prepared
    paths = {f"{split}_{side}": sources[split][i] for split in sources for i, side in enumerate(("src", "tgt"))}
    reference = Corpus(corpus.tokenizer, read_splits(paths), quiet)
    for split in ("train", "valid", "test"):
        for ours, theirs in zip(corpus.lengths(split), reference.lengths(split)):
            np.testing.assert_array_equal(ours, theirs)
        assert corpus.text.get(split) == (reference.text[split] if split != "train" else None)
    for epoch in range(3):
        batches, _ = token_batches(*corpus.lengths("train"), 60, seed=5, epoch=epoch, max_len=40)
        assert len(batches) > 5
        for index in batches:
            for ours, theirs in zip(corpus.batch("train", index), reference.batch("train", index)):
                assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
                np.testing.assert_array_equal(ours, theirs)
    # an arbitrary index list, with repeats and out of order
    index = [7, 0, 7, 149, 3]
    for ours, theirs in zip(corpus.batch("train", index), reference.batch("train", index)):
        np.testing.assert_array_equal(ours, theirs)
    assert len(corpus.ids["train"][0]) == 150
    assert corpus.ids["valid"][1][2].tolist() == reference.ids["valid"][1][2]


def test_bpe_dropout_is_refused_in_one_line(prepared):
    _, corpus = prepared
    corpus.set_bpe_dropout(0.0)
    with pytest.raises(DataError, match="--bpe-dropout 0.1 needs the training text"):
        corpus.set_bpe_dropout(0.1)


def test_workers_write_the_same_arrays_as_one_process(tmp_path, prepared):
    sources, corpus = prepared
    out = prepare_corpus(tmp_path / "two", sources, vocab_size=40, sample_sentences=200, workers=2,
                         rules=KEEP_ALL, chunk_pairs=16, log=quiet)
    for name in ("train.src.bin", "train.tgt.bin", "train.src.idx", "train.tgt.idx", "tokenizer.model"):
        assert (out / name).read_bytes() == (corpus.folder / name).read_bytes(), name


def test_cleaning_rules_and_duplicates():
    pairs = [("a b c", "x y z"),          # kept
             ("", "x"),                   # empty
             ("a", "x y"),                # ratio 2 > 1.5
             ("a b", "x y z"),            # ratio 1.5: kept
             (" ".join(["w"] * 251), "x " * 200),   # 251 words > 250
             ("a b c", "x y z"),          # repeat of the first: dropped
             ("a b c", "x y q")]          # same source, other target: kept
    keep, dropped = clean_pass(iter(pairs), CleanRules())
    assert keep.tolist() == [True, False, False, True, False, False, True]
    assert dropped == {"empty": 1, "ratio": 1, "length": 1, "duplicate": 1}
    keep, dropped = clean_pass(iter(pairs), CleanRules(dedup=False))
    assert keep.tolist()[5] is True and dropped["duplicate"] == 0


def test_a_prepared_folder_is_reused_refused_or_rebuilt(tmp_path, prepared):
    sources, corpus = prepared
    stamp = (corpus.folder / "manifest.json").stat().st_mtime_ns
    messages = []
    prepare_corpus(corpus.folder, sources, vocab_size=40, sample_sentences=200, workers=0, rules=KEEP_ALL,
                   log=messages.append)
    assert "reused" in messages[0] and (corpus.folder / "manifest.json").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="was made from other vocab_size"):
        prepare_corpus(corpus.folder, sources, vocab_size=41, sample_sentences=200, workers=0, rules=KEEP_ALL,
                       log=quiet)
    changed = tmp_path / "changed.src"
    changed.write_text(pathlib.Path(sources["train"][0]).read_text().replace("Der", "Die", 1))
    sources = dict(sources, train=(str(changed), sources["train"][1]))
    with pytest.raises(DataError, match="was made from other sources"):
        prepare_corpus(corpus.folder, sources, vocab_size=40, sample_sentences=200, workers=0, rules=KEEP_ALL,
                       log=quiet)
    prepare_corpus(corpus.folder, sources, vocab_size=40, sample_sentences=200, workers=0, rules=KEEP_ALL,
                   rebuild=True, log=quiet)
    rebuilt = IndexedCorpus(corpus.folder)
    assert rebuilt.manifest["recipe"]["sources"]["train"][0] != corpus.manifest["recipe"]["sources"]["train"][0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_bad_input_leaves_nothing_behind(tmp_path):
    sources = sources_of(tmp_path)
    bad = tmp_path / "bad.src"
    lines = pathlib.Path(sources["train"][0]).read_bytes().split(b"\n")
    lines[40] = "Straße".encode("latin-1")
    bad.write_bytes(b"\n".join(lines))
    with pytest.raises(DataError, match=r"not valid UTF-8 at line 41"):
        prepare_corpus(tmp_path / "out", dict(sources, train=(str(bad), sources["train"][1])), vocab_size=40,
                       workers=0, log=quiet)
    short = tmp_path / "short.tgt"
    short.write_text("One two.\n")
    with pytest.raises(DataError, match="ends after 1 lines but its parallel file goes on"):
        prepare_corpus(tmp_path / "out", dict(sources, train=(sources["train"][0], str(short))), vocab_size=40,
                       workers=0, log=quiet)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_damaged_prepared_folder_is_refused(prepared):
    _, corpus = prepared
    path = corpus.folder / "train.tgt.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(DataError, match="train.tgt.bin' has .* bytes, its manifest says"):
        IndexedCorpus(corpus.folder)
    with pytest.raises(DataError, match="has no manifest.json"):
        IndexedCorpus(corpus.folder.parent)


def test_word_by_word_encoding_equals_the_tokenizer(prepared):
    from minitf.nmt import prepare

    _, corpus = prepared
    tokenizer = corpus.tokenizer
    texts = ["Der Hund sieht ein Haus.", "  mehrere   Leerzeichen\tund\tTabs  ", "no\u00a0break\u2009thin space",
             "don\u00b4t caf\u00e9 \ufb01ne \u00a8x \u00b8y", "Katze", "", "   ", "emoji \U0001f600 und \u200b zero width",
             "Zahlen 1-2-3 und 20-j\u00e4hrige", "der hund der hund der hund"]
    prepare._init_worker(tokenizer.model_bytes(), "int32")
    for cache_words in (prepare.CACHE_WORDS, 0):   # with the cache, and with a full cache
        prepare.CACHE_WORDS, saved = cache_words, prepare.CACHE_WORDS
        try:
            for _ in range(2):                     # the second round reads the cache
                flat, lens = prepare.encode_flat(texts)
                expected = tokenizer.encode(texts)
                assert lens.tolist() == [len(ids) for ids in expected]
                assert flat.tolist() == [i for ids in expected for i in ids]
        finally:
            prepare.CACHE_WORDS = saved
