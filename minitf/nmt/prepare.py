"""Preparing a large parallel corpus once: clean it, train the joint BPE on a sample,
encode every pair in worker processes, and write memory-mapped token arrays
(:mod:`minitf.nmt.data` (its prepared-corpora section)) with a manifest that says what they were made from.

The text is streamed, never held whole: three passes over the training files.

1. Clean (:class:`CleanRules`, the rules of fairseq's ``prepare-wmt14en2de.sh``, whose
   length limits come from Moses' ``clean-corpus-n.perl``): drop a pair with an empty
   side, a side of more than ``max_words`` words, or a word-count ratio above
   ``max_ratio``; then drop repeated pairs (exact duplicates of source and target),
   keeping the first. Duplicates are found with a 64-bit hash per pair in one NumPy
   array (8 bytes a pair), not a set of strings.
2. Sample ``sample_sentences`` sentences (half of them sources, half targets, from
   pairs drawn uniformly without replacement with ``seed``) and train the tokenizer on
   them: sentencepiece's ``input_sentence_size``, done here so that the sample is
   reproducible and never more than the sample is in memory.
3. Encode the kept pairs in chunks in ``workers`` processes, each with its own copy of
   the tokenizer, and append the ids in order to the flat arrays.

The validation and test splits are only checked (a pair with an empty side is
dropped, as :func:`minitf.nmt.data.read_parallel` does): they are the yardstick and
stay whole. Everything is built in a private temp folder that is renamed into place
when complete, so a prepared folder is either whole or absent. A folder whose
manifest records the same sources (by sha256) and settings is reused; a different
one is refused, or rebuilt with ``rebuild=True``.
"""
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
import tempfile
import time

from minitf.backend import host as np
from minitf.nmt import data
from minitf.nmt.download import sigterm_raises
from minitf.nmt.errors import DataError
from minitf.nmt.files import file_sha256, write_atomic, write_json_atomic
from minitf.nmt.tokenizer import Tokenizer, train_tokenizer


@dataclasses.dataclass(frozen=True)
class CleanRules:
    """What training pairs are kept (validation and test are never cleaned).

    Attributes
    ----------
    min_words, max_words : int
        Words (whitespace-separated) per side, inclusive: fairseq cleans with 1 and 250.
    max_ratio : float
        Largest ratio of the longer side's word count to the shorter's (1.5, as
        ``clean-corpus-n.perl -ratio 1.5``).
    dedup : bool
        Drop exact repeats of a (source, target) pair, keeping the first.
    """
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


# --------------------------------------------------------------------------- reading text

def iter_pairs(src_path, tgt_path):
    """Stream the line pairs of two aligned UTF-8 files as ``(src, tgt)`` stripped strings.

    Lines are split on ``\\n`` only, as :func:`minitf.nmt.data.read_lines` does (so line
    numbers match ``wc -l``); a leading BOM is ignored.

    Raises
    ------
    DataError
        A missing file, invalid UTF-8 (with the line number), or files of different lengths.
    """
    src_path, tgt_path = pathlib.Path(src_path), pathlib.Path(tgt_path)
    for path in (src_path, tgt_path):
        if not path.is_file():
            kind = "is a directory" if path.is_dir() else "does not exist"
            raise DataError(f"corpus file {str(path)!r} {kind}; expected a plain UTF-8 text file with one "
                            "sentence per line")
    with open(src_path, "rb") as src_file, open(tgt_path, "rb") as tgt_file:
        number = 0
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
    """A 64-bit hash of a pair (blake2b): equal pairs, equal hashes; among 4.5 million
    distinct pairs a collision has a probability of about 1e-6."""
    return int.from_bytes(hashlib.blake2b(f"{src}\x00{tgt}".encode("utf-8"), digest_size=8).digest(), "little")


def clean_pass(pairs, rules):
    """Pass 1: which pairs of an iterable survive the cleaning.

    Returns
    -------
    keep : ndarray of bool, shape (N,)
        One flag per input pair, in order.
    dropped : dict
        ``{"empty": n, "length": n, "ratio": n, "duplicate": n}``.
    """
    keep = bytearray()
    candidates, hashes = array.array("q"), array.array("Q")   # index and hash of the pairs that pass the rules
    dropped = collections.Counter({"empty": 0, "length": 0, "ratio": 0, "duplicate": 0})
    index = -1
    for index, (src, tgt) in enumerate(pairs):
        why = rules.reason(len(src.split()), len(tgt.split()))
        if why is not None:
            dropped[why] += 1
            keep.append(0)
            continue
        keep.append(1)
        if rules.dedup:
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


# --------------------------------------------------------------------------- encoding

_WORKER = {}
#: Words whose pieces a worker remembers (about 100 bytes each); rarer words are encoded every time.
CACHE_WORDS = 1_000_000


def _init_worker(model_bytes, dtype, worker=False):
    if worker:  # a forked worker inherits sigterm_raises' handler; Pool.terminate's SIGTERM must just end it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER.update(tokenizer=Tokenizer.from_bytes(model_bytes), dtype=dtype, cache={})


def encode_flat(texts):
    """Token ids of ``texts`` as one flat array (dtype of the worker) and lengths (N,) int32:
    the same ids as ``Tokenizer.encode``, found word by word through a cache.

    The tokenizer's BPE never merges across whitespace (sentencepiece's
    ``split_by_whitespace``; its pieces carry the word-start mark only in front), so a
    sentence's ids are its words' ids one after another, and a word once encoded need
    not be encoded again: the Zipfian head of the vocabulary is looked up, only the rare
    words go through sentencepiece (in one call per chunk). tests/test_indexed.py checks
    the equality on text with tabs, no-break spaces, ligatures and accents that Unicode
    normalisation turns into a space plus a combining mark.
    """
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
    if "fork" in multiprocessing.get_all_start_methods() and not (mpi is not None and mpi.Is_initialized()):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def encode_into(writer, chunks, model_bytes, dtype, workers):
    """Encode chunks in ``workers`` processes (0: in this process), appending results in order.

    At most two chunks per worker are in flight, so the text read ahead stays small."""
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


# --------------------------------------------------------------------------- the pipeline

def prepare_corpus(out_dir, sources, vocab_size, *, sample_sentences=1_000_000, seed=1, workers=None,
                   rules=CleanRules(), source_digests=None, languages=("src", "tgt"), rebuild=False,
                   chunk_pairs=10_000, log=print):
    """Prepare (or reuse) a corpus for training from memory-mapped token arrays.

    Parameters
    ----------
    out_dir : str or path-like
        The prepared folder (:mod:`minitf.nmt.data` (its prepared-corpora section) describes its files).
    sources : dict
        ``{"train": (src_path, tgt_path), "valid": (...), "test": (...)}``; test is optional.
        Plain UTF-8 text, one sentence per line, aligned by line. A split may also be a
        list of such pairs (several corpora, read one after another).
    vocab_size : int
        Of the joint BPE (the paper: about 37,000).
    sample_sentences : int
        Sentences the tokenizer is trained on (sentencepiece's ``input_sentence_size``).
    seed : int
        Of the sample and of sentencepiece.
    workers : int or None
        Encoding processes; None: one per CPU; 0: encode in this process.
    rules : CleanRules
        For the training split.
    source_digests : dict or None
        ``{split: [[src_sha256, tgt_sha256], ...]}`` (one pair per file pair), or any
        JSON-able identity the caller vouches for (pinned archives); None: hash the files.
    languages : (str, str)
        Recorded in the manifest, e.g. ``("en", "de")``.
    rebuild : bool
        Replace a prepared folder made from other sources or settings instead of refusing.
    log : callable

    Returns
    -------
    pathlib.Path
        ``out_dir``; open it with :class:`minitf.nmt.data.IndexedCorpus`.

    Raises
    ------
    DataError
        Bad input (see :func:`iter_pairs`), no training pair left after cleaning, or a
        folder prepared from something else (without ``rebuild``).
    """
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
    if _reusable(out_dir, recipe, rebuild):
        log(f"prepared corpus {out_dir}: reused (its manifest matches the sources and settings)")
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        with sigterm_raises():  # SIGTERM too runs the finally below: no temp folder is left
            manifest = _build(work, sources, recipe, rules, workers, chunk_pairs, log)
            write_json_atomic(work / "manifest.json", manifest)  # last: its presence marks a complete folder
            data.finish_folder(work)
            _move_into_place(work, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
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


def _reusable(out_dir, recipe, rebuild):
    """True when ``out_dir`` holds a folder prepared with ``recipe``; refuses a foreign one."""
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
    if manifest.get("recipe") == recipe:
        return True
    if rebuild:
        return False
    theirs = manifest.get("recipe") or {}
    differ = sorted(k for k in set(recipe) | set(theirs) if recipe.get(k) != theirs.get(k))
    raise DataError(f"prepared corpus {str(out_dir)!r} was made from other {', '.join(differ)}; prepare into "
                    "another folder, delete it, or rebuild it (rebuild=True)")


def _move_into_place(work, out_dir):
    """Rename the finished folder to ``out_dir``, replacing an old one only after the new one is whole."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.rename(out_dir, old)
    os.rename(work, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build(work, sources, recipe, rules, workers, chunk_pairs, log):
    started = time.perf_counter()
    train = sources["train"]
    keep, dropped = clean_pass(iter_corpora(train), rules)
    n_kept = int(keep.sum())
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
    texts = []
    for (src, tgt), chosen in zip(iter_corpora(train), in_sample):
        if chosen:
            texts += (src, tgt)
    start = time.perf_counter()
    tokenizer = train_tokenizer(texts, work / "tokenizer.model", recipe["vocab_size"], seed=recipe["seed"])
    del texts
    log(f"trained a joint BPE vocabulary of {tokenizer.vocab_size} on {2 * n_sample:,} sampled sentences "
        f"({time.perf_counter() - start:.0f} s)")

    # pass 3: encode
    start = time.perf_counter()
    dtype = data.token_dtype(tokenizer.vocab_size)
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    splits = {}
    writer = data.SplitWriter(work, "train", dtype)
    try:
        encode_into(writer, _chunks(iter_corpora(train), keep, chunk_pairs),
                    tokenizer.model_bytes(), dtype, workers)
    except BaseException:
        writer.abort()
        raise
    splits["train"] = writer.close()
    log(f"encoded {n_kept:,} training pairs with {workers or 1} process(es) "
        f"({time.perf_counter() - start:.0f} s)")
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
