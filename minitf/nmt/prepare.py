"""Preparing a large parallel corpus once into memory-mapped token arrays (layout: :mod:`minitf.nmt.data`)
with a manifest of what they were made from, streaming the training files three times: (1) clean with
:class:`CleanRules` and drop repeated pairs (one 64-bit hash per pair in a NumPy array, not a set of
strings); (2) train the tokenizer on ``sample_sentences`` sentences of pairs drawn with ``seed``
(sentencepiece's ``input_sentence_size``, done here to be reproducible and small); (3) encode the kept pairs
in chunks in ``workers`` processes, in order. Valid and test only lose pairs with an empty side. The folder
is built privately (a hidden ``.NAME.*.tmp`` folder, locked while its preparation lives) and renamed into place
(whole or absent); one whose manifest records the same sources (sha256) and settings is reused, another refused
(``rebuild=True``, train.py's ``--prepare-again``, replaces it, and a damaged one). The next preparation removes
the temp folders of killed ones."""
import array
import collections
import dataclasses
import hashlib
import itertools
import multiprocessing
import os
import pathlib
import shutil
import signal
import sys
import time

from minitf.backend import host as np
from minitf.nmt import data
from minitf.training.download import sigterm_raises
from minitf.training.errors import DataError, Interrupted, pause_for_tests
from minitf.training.files import file_sha256, fsync_dir, write_atomic, write_json_atomic
from minitf.training.text import move_into_place, start_preparation, token_dtype
from minitf.training.tokenizer import Tokenizer, train_tokenizer


@dataclasses.dataclass(frozen=True)
class CleanRules:
    """What training pairs are kept: ``min_words`` to ``max_words`` words a side (fairseq: 1 and 250), a
    longer-to-shorter word-count ratio of at most ``max_ratio`` (``clean-corpus-n.perl -ratio 1.5``), and with
    ``dedup`` no exact repeat of a pair."""
    min_words: int = 1
    max_words: int = 250
    max_ratio: float = 1.5
    dedup: bool = True

    def reason(self, src_words, tgt_words):
        """Why a pair of these word counts is dropped ("empty", "length", "ratio"), or None."""
        if src_words == 0 or tgt_words == 0:
            return "empty"
        if not (self.min_words <= src_words <= self.max_words and self.min_words <= tgt_words <= self.max_words):
            return "length"
        if max(src_words, tgt_words) > self.max_ratio * min(src_words, tgt_words):
            return "ratio"
        return None


def iter_pairs(src_path, tgt_path):
    """Stream the line pairs of two aligned UTF-8 files as stripped ``(src, tgt)``, split as
    :func:`minitf.training.text.read_lines` does; a DataError for a missing file, bad UTF-8 or unequal lengths."""
    src_path, tgt_path = pathlib.Path(src_path), pathlib.Path(tgt_path)
    for path in (src_path, tgt_path):
        if not path.is_file():
            kind = "is a directory" if path.is_dir() else "does not exist"
            raise DataError(f"corpus file {str(path)!r} {kind}; expected a plain UTF-8 text file with one "
                            "sentence per line")
    with open(src_path, "rb") as src_file, open(tgt_path, "rb") as tgt_file:
        for number, (src, tgt) in enumerate(itertools.zip_longest(src_file, tgt_file), start=1):
            if src is None or tgt is None:
                shorter, n = (src_path, number - 1) if src is None else (tgt_path, number - 1)
                raise DataError(f"{str(shorter)!r} ends after {n} lines but its parallel file goes on; "
                                "parallel files need one translation per line, so fix the alignment")
            if number == 1:
                src, tgt = src.removeprefix(b"\xef\xbb\xbf"), tgt.removeprefix(b"\xef\xbb\xbf")
            yield _decode(src, src_path, number), _decode(tgt, tgt_path, number)


def _decode(line, path, number):
    try:
        return line.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        raise DataError(f"corpus file {str(path)!r} is not valid UTF-8 at line {number} "
                        f"(byte {line[error.start:error.start + 1]!r}); re-encode it as UTF-8") from None


def _pair_hash(src, tgt):
    """A 64-bit blake2b hash of a pair (among 4.5 million pairs a collision has a probability of about 1e-6)."""
    return int.from_bytes(hashlib.blake2b(f"{src}\x00{tgt}".encode("utf-8"), digest_size=8).digest(), "little")


def clean_pass(pairs, rules):
    """Pass 1: ``keep`` (N,) bool, one flag per pair in order, and ``dropped``: counts by reason
    (``empty``, ``length``, ``ratio``, ``duplicate``)."""
    keep = bytearray()
    candidates, hashes = array.array("q"), array.array("Q")   # index and hash of the pairs that pass the rules
    dropped = collections.Counter({"empty": 0, "length": 0, "ratio": 0, "duplicate": 0})
    for index, (src, tgt) in enumerate(pairs):
        why = rules.reason(len(src.split()), len(tgt.split()))
        keep.append(why is None)
        if why is not None:
            dropped[why] += 1
        elif rules.dedup:
            candidates.append(index)
            hashes.append(_pair_hash(src, tgt))
    keep = np.frombuffer(bytes(keep), dtype=np.uint8).astype(bool)
    if rules.dedup and hashes:
        hashes = np.frombuffer(hashes, dtype=np.uint64)
        candidates = np.frombuffer(candidates, dtype=np.int64)
        _, first = np.unique(hashes, return_index=True)         # first occurrence of each hash
        repeated = np.ones(candidates.size, dtype=bool)
        repeated[first] = False
        keep[candidates[repeated]] = False
        dropped["duplicate"] = int(repeated.sum())
    return keep, dict(dropped)


_WORKER = {}
#: Words whose pieces a worker remembers (about 100 bytes each); rarer words are encoded every time.
CACHE_WORDS = 1_000_000


def _init_worker(model_bytes, dtype, worker=False):
    if worker:  # a forked worker inherits sigterm_raises' handler; Pool.terminate's SIGTERM must just end it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER.update(tokenizer=Tokenizer.from_bytes(model_bytes), dtype=dtype, cache={})


def encode_flat(texts):
    """The ids ``Tokenizer.encode`` gives ``texts``, as one flat array (the worker's dtype) and lengths (N,) int32,
    found word by word through a cache: BPE never merges across whitespace, so only new words go through
    sentencepiece (tests/test_indexed.py checks the equality on tabs, no-break spaces, ligatures and accents)."""
    tokenizer, dtype, cache = _WORKER["tokenizer"], _WORKER["dtype"], _WORKER["cache"]
    words = [text.split() for text in texts]
    missing = list({word for sentence in words for word in sentence if word not in cache})
    lookup = cache.__getitem__
    if missing:
        new = dict(zip(missing, map(tuple, tokenizer.encode(missing))))
        if len(cache) + len(new) <= CACHE_WORDS:
            cache.update(new)
        else:
            lookup = lambda word: cache[word] if word in cache else new[word]  # noqa: E731
    pieces = [lookup(word) for sentence in words for word in sentence]
    piece_lens = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))       # (words,)
    word_counts = np.fromiter(map(len, words), dtype=np.int64, count=len(words))        # (N,)
    sentence_of_word = np.repeat(np.arange(len(words)), word_counts)                    # (words,)
    lens = np.bincount(sentence_of_word, weights=piece_lens, minlength=len(words)).astype(np.int32)
    flat = np.fromiter(itertools.chain.from_iterable(pieces), dtype=dtype, count=int(piece_lens.sum()))
    return flat, lens


def _encode_chunk(chunk):
    """(sources, targets) -> (src ids, src lengths, tgt ids, tgt lengths) as flat arrays."""
    src, tgt = chunk
    return (*encode_flat(src), *encode_flat(tgt))


def _chunks(pairs, keep, size):
    """Lists of kept (sources, targets), ``size`` pairs each."""
    src, tgt = [], []
    for (s, t), kept in zip(pairs, keep):
        if kept:
            src.append(s)
            tgt.append(t)
            if len(src) == size:
                yield src, tgt
                src, tgt = [], []
    if src:
        yield src, tgt


def _pool_context():
    """fork where it is safe (quick, and a calling script needs no ``__main__`` guard); spawn in a
    process that has initialised MPI, which must not be forked (an ``mpiexec`` rank)."""
    mpi = sys.modules.get("mpi4py.MPI")
    fork = "fork" in multiprocessing.get_all_start_methods() and not (mpi is not None and mpi.Is_initialized())
    return multiprocessing.get_context("fork" if fork else "spawn")


def encode_into(writer, chunks, model_bytes, dtype, workers):
    """Encode chunks in ``workers`` processes (0: in this process), appending results in order; at most
    two chunks per worker are in flight, so the text read ahead stays small."""
    if workers == 0:
        _init_worker(model_bytes, dtype)
        for chunk in chunks:
            writer.add(*_encode_chunk(chunk))
        return
    with _pool_context().Pool(workers, initializer=_init_worker, initargs=(model_bytes, dtype, True)) as pool:
        pending = collections.deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_chunk, (chunk,)))
            if len(pending) >= 2 * workers:
                writer.add(*pending.popleft().get())
        while pending:
            writer.add(*pending.popleft().get())


def prepare_corpus(out_dir, sources, vocab_size, *, sample_sentences=1_000_000, seed=1, workers=None,
                   rules=CleanRules(), source_digests=None, languages=("src", "tgt"), rebuild=False,
                   chunk_pairs=10_000, log=print):
    """Prepare (or reuse) ``out_dir``, a corpus of memory-mapped token arrays, and return it (open it with
    :class:`minitf.nmt.data.IndexedCorpus`). ``sources``: ``{"train": (src_path, tgt_path), "valid": ...,
    "test": ...}`` (test optional; a split may be a list of pairs, read in turn). ``workers``: None one per CPU,
    0 this process. ``rules``: for train only. ``source_digests``: ``{split: [[src_sha256, tgt_sha256], ...]}``
    or another JSON identity the caller vouches for (None: hash the files). ``rebuild``: replace a folder made
    otherwise, or one that fails :class:`minitf.nmt.data.IndexedCorpus`'s checks, instead of refusing it (a whole
    folder of the same recipe is still reused). A DataError for bad input, no training pair left after cleaning,
    or a foreign folder."""
    out_dir = pathlib.Path(out_dir)
    for split in ("train", "valid"):
        if split not in sources:
            raise DataError(f"preparing a corpus needs a {split} split (source and target files), got "
                            f"{sorted(sources)}")
    sources = {split: _file_pairs(paths) for split, paths in sources.items()}
    if source_digests is None:
        source_digests = {split: [[_digest(p) for p in pair] for pair in pairs] for split, pairs in sources.items()}
    recipe = dict(sources={split: _plain(source_digests[split]) for split in sources}, vocab_size=int(vocab_size),
                  sample_sentences=int(sample_sentences), seed=int(seed), rules=dataclasses.asdict(rules),
                  languages=list(languages))
    started = start_preparation(out_dir, lambda: _reusable(out_dir, recipe, rebuild, log), "prepared corpus", log)
    if started is None:
        return out_dir
    work, held = started
    try:
        with sigterm_raises():  # SIGTERM too runs the finally below: no temp folder is left
            manifest = _build(work, sources, recipe, rules, workers, chunk_pairs, log)
            write_json_atomic(work / "manifest.json", manifest)  # last: its presence marks a complete folder
            fsync_dir(work)
            move_into_place(work, out_dir)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM: say what is kept
        shutil.rmtree(work, ignore_errors=True)
        if (out_dir / "manifest.json").is_file() or isinstance(stop, Interrupted):
            raise
        raise Interrupted(getattr(stop, "signum", signal.SIGINT), f"stopped preparing {out_dir} and removed its "
                          "temp folder: nothing was kept; the same command prepares it again") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if held is not None:
            os.close(held)
    return out_dir


def _file_pairs(paths):
    """One ``(src, tgt)`` pair, or a list of them (corpora read one after another), as a list of pairs."""
    if len(paths) == 2 and all(isinstance(p, (str, os.PathLike)) for p in paths):
        return [tuple(paths)]
    return [tuple(pair) for pair in paths]


def iter_corpora(pairs):
    """The line pairs of several aligned file pairs, one corpus after another."""
    for src, tgt in pairs:
        yield from iter_pairs(src, tgt)


def _plain(value):
    """Tuples to lists, as JSON gives them back (a manifest compares equal to its recipe)."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _digest(path):
    if not pathlib.Path(path).is_file():
        raise DataError(f"corpus file {str(path)!r} does not exist; expected a plain UTF-8 text file with one "
                        "sentence per line")
    return file_sha256(path)


def _reusable(out_dir, recipe, rebuild, log):
    """True when ``out_dir`` holds a folder prepared with ``recipe`` (with ``rebuild``: one that also passes every
    check of :class:`minitf.nmt.data.IndexedCorpus`); refuses a foreign one."""
    if not out_dir.exists():
        return False
    if not out_dir.is_dir():
        raise DataError(f"{str(out_dir)!r} is a file, not a prepared corpus folder; choose another folder")
    if not (out_dir / "manifest.json").is_file():
        if any(out_dir.iterdir()):
            raise DataError(f"{str(out_dir)!r} is not empty and holds no prepared corpus (no manifest.json); "
                            "choose another folder")
        return False
    try:
        manifest = data.read_manifest(out_dir)
    except DataError:
        if rebuild:
            return False
        raise
    if manifest["recipe"] == recipe:
        if not rebuild:
            return True  # opening it checks it (IndexedCorpus)
        try:
            data.IndexedCorpus(out_dir)
            return True
        except DataError as error:
            log(f"preparing {out_dir} again: {error}")
            return False
    if rebuild:
        return False
    theirs = manifest["recipe"]
    differ = sorted(k for k in set(recipe) | set(theirs) if recipe.get(k) != theirs.get(k))
    raise DataError(f"prepared corpus {str(out_dir)!r} was made from other {', '.join(differ)}; choose another "
                    "--corpus-dir, or replace it: train.py --prepare-again with these data flags")


def _build(work, sources, recipe, rules, workers, chunk_pairs, log):
    started = time.perf_counter()
    train = sources["train"]
    keep, dropped = clean_pass(iter_corpora(train), rules)
    n_kept = int(keep.sum())
    pause_for_tests("prepare")
    log(f"cleaned the training pairs: {keep.size:,} read, {n_kept:,} kept, dropped {dropped} "
        f"({time.perf_counter() - started:.0f} s)")
    if n_kept == 0:
        raise DataError(f"no training pair of {[str(p) for pair in train for p in pair]} is left after cleaning "
                        f"(dropped: {dropped}); check the files and their alignment")

    # pass 2: the tokenizer's sample
    kept_index = np.flatnonzero(keep)
    n_sample = min(n_kept, max(1, recipe["sample_sentences"] // 2))
    rng = np.random.default_rng(recipe["seed"])
    in_sample = np.zeros(keep.size, dtype=bool)
    in_sample[rng.choice(kept_index, size=n_sample, replace=False)] = True
    texts = [text for pair, chosen in zip(iter_corpora(train), in_sample) if chosen for text in pair]
    start = time.perf_counter()
    tokenizer = train_tokenizer(texts, work / "tokenizer.model", recipe["vocab_size"], seed=recipe["seed"])
    del texts
    log(f"trained a joint BPE vocabulary of {tokenizer.vocab_size} on {2 * n_sample:,} sampled sentences "
        f"({time.perf_counter() - start:.0f} s)")

    # pass 3: encode
    start = time.perf_counter()
    dtype = token_dtype(tokenizer.vocab_size)
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    splits = {}
    writer = data.SplitWriter(work, "train", dtype)
    try:
        encode_into(writer, _chunks(iter_corpora(train), keep, chunk_pairs), tokenizer.model_bytes(), dtype, workers)
    except BaseException:
        writer.abort()
        raise
    splits["train"] = writer.close()
    log(f"encoded {n_kept:,} training pairs with {workers or 1} process(es) ({time.perf_counter() - start:.0f} s)")
    for split in ("valid", "test"):
        if split not in sources:
            continue
        pairs = [(s, t) for s, t in iter_corpora(sources[split]) if s and t]
        if not pairs:
            raise DataError(f"the {split} files {sources[split]} have no line pair with both sides; check them")
        src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
        writer = data.SplitWriter(work, split, dtype)
        _init_worker(tokenizer.model_bytes(), dtype)
        writer.add(*_encode_chunk((src, tgt)))
        splits[split] = writer.close()
        for side, lines in (("src", src), ("tgt", tgt)):
            write_atomic(work / f"{split}.{side}.txt", "".join(line + "\n" for line in lines))
    log(f"prepared the corpus in {time.perf_counter() - started:.0f} s: "
        + ", ".join(f"{s} {c['pairs']:,} pairs" for s, c in splits.items()))
    return dict(format_version=data.FORMAT_VERSION, recipe=recipe, tokenizer_sha256=tokenizer.sha256,
                vocab_size=tokenizer.vocab_size, dtype=dtype, splits=splits,
                cleaning=dict(read=int(keep.size), kept=n_kept, dropped=dropped))
