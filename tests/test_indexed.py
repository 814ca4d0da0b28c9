"""The prepared (memory-mapped) corpus: the same batches as the in-memory Corpus,
the cleaning rules, reuse / refusal / rebuild, and nothing half-written."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from minitf.backend import host as np
from minitf.nmt.data import Corpus, read_splits, token_batches
from minitf.training.errors import DataError
from minitf.nmt.data import IndexedCorpus
from minitf.nmt.prepare import CleanRules, clean_pass, prepare_corpus
from tests.runs import change_manifest, make_corpus

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


# --------------------------------------------------------------------------- a prepared folder is verified on open
@pytest.fixture(scope="module")
def good_folder(tmp_path_factory):
    """A prepared folder, and a tokenizer.model of the same vocabulary size made from other text."""
    from minitf.training.tokenizer import train_tokenizer
    base = tmp_path_factory.mktemp("good")
    out = prepare_corpus(base / "prepared", sources_of(base, n_train=60, n_valid=8), vocab_size=40,
                         sample_sentences=200, workers=0, rules=KEEP_ALL, log=quiet)
    other = tmp_path_factory.mktemp("other")
    texts = pathlib.Path(sources_of(other, n_train=60, seed=1)["train"][0]).read_text().splitlines()
    tokenizer = train_tokenizer(texts[:20], other / "tokenizer.model", 40)
    assert tokenizer.vocab_size == 40 and tokenizer.sha256 != IndexedCorpus(out).tokenizer.sha256
    return out, other / "tokenizer.model"


def _offset(name, index, value):
    def damage(folder):
        offsets = np.fromfile(folder / name, dtype="<i8")
        offsets[index] = value(offsets) if callable(value) else value
        offsets.tofile(folder / name)
    return damage


def _swap_offsets(name, i):
    def damage(folder):
        offsets = np.fromfile(folder / name, dtype="<i8")
        offsets[[i, i + 1]] = offsets[[i + 1, i]]
        offsets.tofile(folder / name)
    return damage


def _out_of_vocabulary(folder):
    ids = np.fromfile(folder / "train.tgt.bin", dtype="<u2")
    ids[7] = 40
    ids.tofile(folder / "train.tgt.bin")


def _split_outside(folder):
    """A split named ../victim/x whose files exist outside the folder (as an attacker would leave them)."""
    victim = folder.parent / "victim"
    victim.mkdir()
    for side in ("src", "tgt"):
        for kind in ("bin", "idx"):
            shutil.copy(folder / f"valid.{side}.{kind}", victim / f"x.{side}.{kind}")
    change_manifest(lambda m: m["splits"].__setitem__("../victim/x", dict(m["splits"]["valid"])))(folder)


def _linked_outside(folder):
    outside = folder.parent / "elsewhere.bin"
    shutil.copy(folder / "train.src.bin", outside)
    (folder / "train.src.bin").unlink()
    (folder / "train.src.bin").symlink_to(outside)


def _replaced_tokenizer(folder, other):
    shutil.copy(other, folder / "tokenizer.model")


# name: (damage(folder[, other tokenizer]), words the one-line refusal holds besides the prepare-again step)
BAD_PREPARED = {
    "valid.src.idx offset 10**9": (_offset("valid.src.idx", 3, 10 ** 9), ["valid.src.idx", "past the end"]),
    "train.src.idx offset 10**12": (_offset("train.src.idx", 5, 10 ** 12), ["train.src.idx", "past the end"]),
    "train.tgt.idx offsets swapped": (_swap_offsets("train.tgt.idx", 20), ["train.tgt.idx", "never decrease"]),
    "negative offset": (_offset("train.src.idx", 2, -7), ["train.src.idx", "never decrease"]),
    "first offset 1": (_offset("test.tgt.idx", 0, 1), ["test.tgt.idx", "not 0"]),
    "last offset short of the end": (_offset("train.src.idx", -1, lambda o: o[-1] - 1),
                                     ["train.src.idx", "ends at offset"]),
    "id outside the vocabulary": (_out_of_vocabulary, ["train.tgt.bin", "id 40, outside the vocabulary"]),
    "truncated .bin": (lambda f: (f / "valid.tgt.bin").write_bytes((f / "valid.tgt.bin").read_bytes()[:-2]),
                       ["valid.tgt.bin", "bytes, its manifest says"]),
    "replaced tokenizer.model": (_replaced_tokenizer, ["tokenizer.model", "not the tokenizer its manifest names"]),
    "missing tokenizer.model": (lambda f: (f / "tokenizer.model").unlink(), ["tokenizer.model", "missing"]),
    "manifest not JSON": (lambda f: (f / "manifest.json").write_text("{"), ["manifest.json", "not valid JSON"]),
    "format_version true": (change_manifest(lambda m: m.update(format_version=True)), ["manifest.json", "version True"]),
    "manifest a list": (lambda f: (f / "manifest.json").write_text("[1]"), ["manifest.json", "version None"]),
    "pairs 'abc'": (change_manifest(lambda m: m["splits"]["train"].update(pairs="abc")), ["splits.train.pairs", "'abc'"]),
    "pairs true": (change_manifest(lambda m: m["splits"]["valid"].update(pairs=True)), ["splits.valid.pairs"]),
    "pairs 1.5": (change_manifest(lambda m: m["splits"]["valid"].update(pairs=1.5)), ["splits.valid.pairs"]),
    "tokens missing": (change_manifest(lambda m: m["splits"]["test"].pop("tgt_tokens")), ["splits.test.tgt_tokens"]),
    "dtype 'not-a-dtype'": (change_manifest(lambda m: m.update(dtype="not-a-dtype")), ["dtype", "'not-a-dtype'"]),
    "dtype int32 for 40 ids": (change_manifest(lambda m: m.update(dtype="int32")), ["dtype", "'uint16'"]),
    "vocab_size 'forty'": (change_manifest(lambda m: m.update(vocab_size="forty")), ["vocab_size"]),
    "vocab_size 41": (change_manifest(lambda m: m.update(vocab_size=41)), ["tokenizer.model", "has 40 ids"]),
    "tokenizer_sha256 a number": (change_manifest(lambda m: m.update(tokenizer_sha256=7)), ["tokenizer_sha256"]),
    "valid split missing": (change_manifest(lambda m: m["splits"].pop("valid")), ["splits", "a valid split"]),
    "recipe missing": (change_manifest(lambda m: m.pop("recipe")), ["recipe"]),
    "splits a list": (change_manifest(lambda m: m.update(splits=["train", "valid"])), ["splits"]),
    "a split's counts a string": (change_manifest(lambda m: m["splits"].update(valid="8")), ["splits.valid"]),
    "languages 'x'": (change_manifest(lambda m: m["recipe"].update(languages="x")), ["recipe.languages"]),
    "cleaning missing": (change_manifest(lambda m: m.pop("cleaning")), ["cleaning"]),
    "split named ../victim/x": (_split_outside, ["'../victim/x'", "only train, valid and test"]),
    "a split named lexicon": (change_manifest(lambda m: m["splits"].update(lexicon=m["splits"]["valid"])), ["lexicon"]),
    ".bin a link outside the folder": (_linked_outside, ["train.src.bin", "outside the folder"]),
}


def damaged_copy(good_folder, tmp_path, case):
    folder, other_tokenizer = good_folder
    copy = shutil.copytree(folder, tmp_path / "prepared")
    damage, _ = BAD_PREPARED[case]
    damage(copy, other_tokenizer) if damage is _replaced_tokenizer else damage(copy)
    return copy


def assert_refusal(message, case):
    assert "\n" not in message and "Traceback" not in message, message
    for words in BAD_PREPARED[case][1]:
        assert words in message, (words, message)
    assert "train.py --prepare-again" in message and "rebuild=True" not in message, message


@pytest.mark.parametrize("case", list(BAD_PREPARED))
def test_a_damaged_or_forged_prepared_folder_is_refused_in_one_line(good_folder, tmp_path, case):
    """Through the library: every damage is a one-line DataError naming the file and the step that mends it."""
    copy = damaged_copy(good_folder, tmp_path, case)
    with pytest.raises(DataError) as error:
        IndexedCorpus(copy)
    assert_refusal(str(error.value), case)


@pytest.mark.parametrize("case", list(BAD_PREPARED))
def test_train_py_refuses_a_damaged_corpus_dir_in_one_line(good_folder, tmp_path, case, capsys):
    """Through `train.py --corpus-dir`: exit 1, one line (no traceback), nothing written."""
    from tests.runs import QUIET, TINY, one_error_line, train
    copy = damaged_copy(good_folder, tmp_path, case)
    code, err = train(TINY + QUIET + ["--max-steps", "1", "--corpus-dir", copy, "--out", tmp_path / "run"], capsys)
    assert code == 1 and len(err) == 1, err
    assert_refusal(one_error_line(err), case)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 7])
def test_the_chunked_checks_find_a_fault_at_every_position(chunk):
    """Every chunk size finds a falling offset, one past the end, and a bad id wherever it is (chunk edges too)."""
    from minitf.training.text import check_ids, check_offsets
    good = np.array([0, 2, 2, 5, 6, 9, 11, 12, 15], dtype=np.int64)
    check_offsets(good, 15, pathlib.Path("x.idx"), chunk=chunk)
    for i in range(1, good.size - 1):
        falling = good.copy()
        falling[i] = good[i - 1] - 1
        with pytest.raises(DataError, match="never decrease"):
            check_offsets(falling, 15, pathlib.Path("x.idx"), chunk=chunk)
        beyond = good.copy()
        beyond[i] = 16
        with pytest.raises(DataError, match="at index %d, past the end" % i):
            check_offsets(beyond, 15, pathlib.Path("x.idx"), chunk=chunk)
    ids = np.arange(4, 14, dtype=np.uint16)
    check_ids(ids, 14, pathlib.Path("x.bin"), chunk=chunk)
    for i in range(ids.size):
        bad = ids.copy()
        bad[i] = 14
        with pytest.raises(DataError, match="id 14, outside"):
            check_ids(bad, 14, pathlib.Path("x.bin"), chunk=chunk)


def test_the_array_helpers_accept_id_0_hold_65536_ids_in_16_bits_and_map_read_only(tmp_path):
    """The edges of the prepared-array helpers: id 0 (a character tokenizer's unknown character) and the last id
    are inside the vocabulary, -1 is not; uint16 holds exactly 65,536 ids; a mapped array cannot be written
    (a bug cannot change the prepared corpus on disk), an empty split is an empty array, a missing file one line."""
    from minitf.training.text import check_ids, map_array, token_dtype
    check_ids(np.array([0, 13, 0], dtype=np.int32), 14, pathlib.Path("x.bin"))
    with pytest.raises(DataError, match="holds id -1, outside the vocabulary of 14"):
        check_ids(np.array([3, -1], dtype=np.int32), 14, pathlib.Path("x.bin"))
    assert [token_dtype(n) for n in (14, 65535, 65536, 65537, 10 ** 6)] == ["uint16"] * 3 + ["int32"] * 2
    np.array([7, 0, 65535], dtype="<u2").tofile(tmp_path / "a.bin")
    mapped = map_array(tmp_path, "a.bin", np.dtype("<u2"), 3)
    assert mapped.tolist() == [7, 0, 65535] and not mapped.flags.writeable
    with pytest.raises(ValueError):
        mapped[0] = 1
    (tmp_path / "empty.bin").write_bytes(b"")
    assert map_array(tmp_path, "empty.bin", np.dtype("<u2"), 0).size == 0
    with pytest.raises(DataError, match="'.*nope.bin' is missing"):
        map_array(tmp_path, "nope.bin", np.dtype("<u2"), 3)


def test_opening_a_large_prepared_folder_checks_it_in_bounded_memory(good_folder, tmp_path, monkeypatch):
    """A training split of 1,000,000 pairs (8 MB of offsets, 4 MB of ids a side) is checked with at most a few
    chunks of temporaries (tracemalloc counts NumPy's allocations); a fault at its very end is still found."""
    import tracemalloc
    from minitf.training import text
    folder = shutil.copytree(good_folder[0], tmp_path / "prepared")
    n = 1_000_000
    lengths = np.full(n, 2, dtype=np.int64)
    for side in ("src", "tgt"):
        np.concatenate([[0], np.cumsum(lengths)]).astype("<i8").tofile(folder / f"train.{side}.idx")
        (np.arange(2 * n) % 36 + 4).astype("<u2").tofile(folder / f"train.{side}.bin")
    change_manifest(lambda m: m["splits"].update(train=dict(pairs=n, src_tokens=2 * n, tgt_tokens=2 * n)))(folder)
    monkeypatch.setattr(text, "VERIFY_CHUNK", 1 << 14)
    tracemalloc.start()
    try:
        corpus = IndexedCorpus(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(corpus.ids["train"][0]) == n
    assert peak < 640 << 10, peak        # unchunked: 1.26 MB; the arrays themselves are 12 MB a side
    _offset("train.tgt.idx", n - 1, 2 * n + 1)(folder)
    with pytest.raises(DataError, match=f"train.tgt.idx' has offset {2 * n + 1} at index {n - 1}, past the end"):
        IndexedCorpus(folder)


def test_a_killed_preparations_temp_folder_is_removed_by_the_next_and_a_live_ones_kept(tmp_path):
    """A preparation holds a lock on its temp folder while it lives: a concurrent one leaves it alone; once the
    first is killed (SIGKILL: no cleanup runs) the next preparation removes it."""
    from tests.runs import ROOT
    sources = sources_of(tmp_path)
    out = tmp_path / "prepared"
    stalled = ("import sys, time\nfrom minitf.nmt import prepare\n"
               "def build(*args):\n    print('building', flush=True)\n    time.sleep(600)\n"
               "prepare._build = build\n"
               f"prepare.prepare_corpus(sys.argv[1], {sources!r}, 40, workers=0, log=lambda m: None)\n")
    child = subprocess.Popen([sys.executable, "-c", stalled, str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert child.stdout.readline() == b"building\n", child.stderr.read()
        work = list(tmp_path.glob(".prepared.*.tmp"))
        assert len(work) == 1
        messages = []
        prepare_corpus(out, sources, vocab_size=40, workers=0, rules=KEEP_ALL, log=messages.append)
        assert work[0].is_dir() and not any("removed" in m for m in messages), messages   # alive: kept
    finally:
        child.kill()
        child.wait()
    assert work[0].is_dir()                      # SIGKILL ran no cleanup
    messages = []
    prepare_corpus(out, sources, vocab_size=40, workers=0, rules=KEEP_ALL, log=messages.append)
    assert "removed 1 temp folder(s) left by killed preparations" in messages[0] and "reused" in messages[1]
    assert not work[0].exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    IndexedCorpus(out)


def test_prepare_again_replaces_a_changed_or_damaged_corpus_dir(tmp_path, capsys):
    """`train.py --train-src ... --corpus-dir DIR`: a changed source is refused with the flag that mends it
    (never the library's rebuild=True); `--prepare-again` prepares DIR again, and mends a damaged DIR too."""
    from tests.runs import QUIET, TINY, make_corpus, one_error_line, train
    corpus = make_corpus(tmp_path)
    prepared = tmp_path / "prepared"
    steps = TINY + QUIET + ["--max-steps", "1", "--corpus-dir", prepared]
    code, err = train(corpus + steps + ["--out", tmp_path / "a"], capsys)
    assert code == 0, err
    first = json.loads((prepared / "manifest.json").read_text())
    src = pathlib.Path(corpus[corpus.index("--train-src") + 1])
    src.write_text(src.read_text().replace("Der", "Die", 1))
    code, err = train(corpus + steps + ["--out", tmp_path / "b"], capsys)
    line = one_error_line(err)
    assert code == 1 and "was made from other sources" in line and "train.py --prepare-again" in line, err
    assert "rebuild=True" not in line and not (tmp_path / "b").exists()
    code, err = train(corpus + steps + ["--prepare-again", "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    second = json.loads((prepared / "manifest.json").read_text())
    assert second["recipe"]["sources"] != first["recipe"]["sources"]
    _offset("train.src.idx", 5, 10 ** 12)(prepared)
    code, err = train(steps + ["--out", tmp_path / "c"], capsys)
    assert code == 1 and "train.py --prepare-again" in one_error_line(err), err
    code, err = train(steps + ["--prepare-again", "--out", tmp_path / "c"], capsys)
    assert code == 2 and "give them too (--train-src" in one_error_line(err), err
    code, err = train(corpus + steps + ["--prepare-again", "--out", tmp_path / "c"], capsys)
    assert code == 0 and any("preparing" in line and "again: " in line and "past the end" in line for line in err)
    IndexedCorpus(prepared)
    code, err = train(TINY + ["--prepare-again", "--out", tmp_path / "d"], capsys)
    assert code == 2 and "needs --corpus-dir DIR" in one_error_line(err), err


def test_a_large_train_src_without_corpus_dir_first_says_that_corpus_dir_keeps_memory_flat(tmp_path, capsys,
                                                                                            monkeypatch):
    from minitf.nmt import task as translation_task
    from tests.runs import QUIET, TINY, make_corpus, train
    corpus = make_corpus(tmp_path)             # 120 training pairs
    monkeypatch.setattr(translation_task, "LARGE_CORPUS_LINES", 100)
    code, err = train(corpus + TINY + QUIET + ["--max-steps", "1", "--out", tmp_path / "run"], capsys)
    assert code == 0 and err[0].startswith("note: --train-src has over 100 lines") and "--corpus-dir DIR" in err[0]
    assert sum("--corpus-dir" in line for line in err) == 1, err
    monkeypatch.setattr(translation_task, "LARGE_CORPUS_LINES", 120)
    translation_task.warn_if_large(corpus[corpus.index("--train-src") + 1])
    assert capsys.readouterr().err == ""      # 120 lines are not over 120
    assert translation_task.count_lines(corpus[corpus.index("--train-src") + 1], 10 ** 9) == 120
