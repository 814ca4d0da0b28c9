"""Translation's data pipeline (host NumPy): parallel text, token-count batching, padding, the encoded
splits of a run, and prepared parallel corpora (memory-mapped token arrays checked by :mod:`minitf.training.text`).
Bad input is a one-line DataError saying what was expected, what came and what to do."""
import hashlib
import os
import pathlib
import re
import reprlib

from minitf.backend import host as np
from minitf.training.errors import DataError
from minitf.training.text import (MAX_CHARS, check_ids, check_offsets, damaged_file, inside_folder, load_manifest,
                                  map_array, read_lines, token_dtype)
from minitf.training.tokenizer import BOS_ID, EOS_ID, PAD_ID, BpeDropout, Tokenizer


class Pairs(list):
    """A list of ``(source, target)`` pairs; ``n_dropped``: line pairs skipped for an empty side."""

    def __init__(self, pairs=(), n_dropped=0):
        super().__init__(pairs)
        self.n_dropped = int(n_dropped)


def read_parallel(src_path, tgt_path, max_chars=MAX_CHARS):
    """:class:`Pairs` of two aligned files (line *i* of one translates line *i* of the other); line pairs
    with an empty side are dropped and counted. A DataError as :func:`read_lines`, or for unequal line counts."""
    src = read_lines(src_path, "source", max_chars)
    tgt = read_lines(tgt_path, "target", max_chars)
    if len(src) != len(tgt):
        raise DataError(f"source {str(src_path)!r} has {len(src)} lines but target {str(tgt_path)!r} has {len(tgt)}; "
                        "parallel files need one translation per line, so fix the alignment")
    pairs = [(s, t) for s, t in zip(src, tgt) if s and t]
    if not pairs:
        raise DataError(f"no line of {str(src_path)!r} / {str(tgt_path)!r} has both a source "
                        "and a target sentence; check that the files are aligned")
    return Pairs(pairs, n_dropped=len(src) - len(pairs))


def read_splits(paths):
    """``{"train": Pairs, "valid": ..., "test": ..., "lexicon": ...}`` from ``{"train_src": path, "train_tgt": ...,
    "valid_src", ..., "test_tgt", "lexicon_src", "lexicon_tgt"}``, each read once; a split whose source path is
    None (or missing) is left out."""
    return {split: read_parallel(paths[f"{split}_src"], paths[f"{split}_tgt"])
            for split in ("train", "valid", "test", "lexicon") if paths.get(f"{split}_src") is not None}


def token_batches(src_lens, tgt_lens, max_tokens, seed, epoch, max_len=None):
    """``(batches, n_skipped)``: int64 index arrays of sentences of similar length under a token budget. Sorted by
    (source, target) length with random ties, cut into runs with ``max(len) * count <= max_tokens`` a side
    (lengths counting the BOS/EOS a batch carries; one sentence over budget is a batch), shuffled; the same
    ``(seed, epoch)`` gives the same batches. Sentences over ``max_len`` on either side are skipped and counted."""
    src = np.asarray(src_lens, dtype=np.int64).reshape(-1)
    tgt = np.asarray(tgt_lens, dtype=np.int64).reshape(-1)
    if src.shape != tgt.shape:
        raise DataError(f"token_batches needs one target length per source length, got {src.size} and {tgt.size}")
    if int(max_tokens) < 1:
        raise DataError(f"max_tokens must be a positive number of tokens, got {max_tokens}; raise --max-tokens")
    rng = np.random.default_rng([int(seed), int(epoch)])
    keep = np.arange(src.size)
    if max_len is not None:
        keep = keep[(src <= max_len) & (tgt <= max_len)]
    # lexsort: last key is primary; the random key breaks ties between equal lengths.
    order = keep[np.lexsort((rng.random(keep.size), tgt[keep], src[keep]))]
    batches = [np.asarray(run, dtype=np.int64)
               for run in _cut_runs(order.tolist(), src.tolist(), tgt.tolist(), int(max_tokens))]
    batches = [batches[i] for i in rng.permutation(len(batches)).tolist()]
    return batches, int(src.size - keep.size)


def _cut_runs(order, src, tgt, max_tokens):
    """Greedily cut ``order`` into runs whose padded size fits ``max_tokens`` per side."""
    runs, current, max_src, max_tgt = [], [], 0, 0
    for index in order:
        new_src, new_tgt = max(max_src, src[index]), max(max_tgt, tgt[index])
        count = len(current) + 1
        if current and (new_src * count > max_tokens or new_tgt * count > max_tokens):
            runs.append(current)
            current, new_src, new_tgt = [], src[index], tgt[index]
        current.append(index)
        max_src, max_tgt = new_src, new_tgt
    if current:
        runs.append(current)
    return runs


def pad_batch(seqs, pad_id, bos_id=None, eos_id=None):
    """Token sequences as a right-padded int64 matrix (B, L), with ``bos_id`` / ``eos_id`` (when given)
    added to each; L is the longest sequence with them."""
    extra_front = [] if bos_id is None else [int(bos_id)]
    extra_back = [] if eos_id is None else [int(eos_id)]
    rows = [extra_front + [int(t) for t in seq] + extra_back for seq in seqs]
    if not rows:
        raise DataError("pad_batch needs at least one sequence, got none")
    out = np.full((len(rows), max(len(row) for row in rows)), int(pad_id), dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def make_target_io(seqs, pad_id, bos_id, eos_id):
    """Teacher forcing: ``tgt_in`` = ``[bos] + seq`` and ``tgt_out`` = ``seq + [eos]``, both (B, L), so
    ``tgt_out[:, t]`` is the token to predict after reading ``tgt_in[:, :t + 1]``."""
    return pad_batch(seqs, pad_id, bos_id=bos_id), pad_batch(seqs, pad_id, eos_id=eos_id)


class Corpus:
    """The encoded splits of a run (lists of token-id lists per side) from :func:`read_splits`' ``splits``;
    ``log`` takes one message (how many empty line pairs were dropped). A ``lexicon`` split is kept as text:
    each epoch encodes only its sample (:meth:`start_epoch`). Batches use the tokenizer's pad and eos ids and
    start the decoder's input with ``bos_id`` (default: the tokenizer's; a Marian model's own start token, its
    config's decoder_start_token_id); a tokenizer with ``encode_target`` (a Marian folder's: its target.spm)
    segments the target side with it."""

    def __init__(self, tokenizer, splits, log, bos_id=None):
        self.tokenizer = tokenizer
        self.bos_id = tokenizer.bos_id if bos_id is None else bos_id
        self.encode_target = getattr(tokenizer, "encode_target", tokenizer.encode)
        self.text = {}
        self.ids = {}
        for split, pairs in splits.items():
            if pairs.n_dropped:
                log(f"{split}: dropped {pairs.n_dropped} line pairs with an empty side")
            self.text[split] = ([s for s, _ in pairs], [t for _, t in pairs])
            if split != "lexicon":
                self.ids[split] = (tokenizer.encode(self.text[split][0]), self.encode_target(self.text[split][1]))
        self.sentence_ids = self.ids.get("train")  # the training split's own ids, before any lexicon is mixed in
        self._samplers, self._sampled_epoch = None, None  # BPE-dropout (set_bpe_dropout)
        self.lexicon_ratio = 0.0

    def set_bpe_dropout(self, p):
        """Segment the training split anew each epoch with BPE-dropout ``p`` (0: never);
        validation and test keep the deterministic segmentation."""
        self._samplers = None
        if p > 0 and "train" in self.text:
            self._samplers = tuple(BpeDropout(self.tokenizer, side, p) for side in self.text["train"])
        self._sampled_epoch = None

    def set_lexicon(self, ratio):
        """Mix ``ratio`` lexicon pairs per training sentence into each epoch (``--lexicon``): a new
        sample of the ``lexicon`` split every epoch, so the dictionary is covered over the run."""
        if ratio > 0 and "lexicon" not in self.text:
            raise DataError("--lexicon needs the dictionary's lexicon split (the default corpus)")
        self.lexicon_ratio = ratio
        self._sampled_epoch = None

    def start_epoch(self, seed, epoch):
        """Training ids for ``epoch``, the same on a resumed run: with BPE-dropout, the sentences'
        sample of ``(seed, epoch)``; with a lexicon, the sentences and that epoch's lexicon pairs."""
        if (not self._samplers and not self.lexicon_ratio) or self._sampled_epoch == (seed, epoch):
            return
        src, tgt = self.sentence_ids
        if self._samplers:
            src, tgt = (sampler.sample(seed, epoch) for sampler in self._samplers)
        if self.lexicon_ratio:
            lex_src, lex_tgt = self.text["lexicon"]
            count = min(len(lex_src), round(self.lexicon_ratio * len(src)))
            # its own stream: the batches' shuffle of (seed, epoch) stays what it is without the lexicon
            chosen = np.random.default_rng([seed, epoch, 0x1E81C0]).choice(len(lex_src), count, replace=False)
            src = src + self.tokenizer.encode([lex_src[i] for i in chosen])
            tgt = tgt + self.encode_target([lex_tgt[i] for i in chosen])
        self.ids["train"] = (src, tgt)
        self._sampled_epoch = (seed, epoch)

    def lengths(self, split):
        """Host int arrays (N,), (N,): tokens per sentence with EOS (source) and BOS (target) added."""
        src, tgt = self.ids[split]
        return np.array([len(s) + 1 for s in src]), np.array([len(t) + 1 for t in tgt])

    def batch(self, split, index):
        """Host int arrays (src (B, S), tgt_in (B, T), tgt_out (B, T)) for sentence indices."""
        src, tgt = self.ids[split]
        t = self.tokenizer
        tgt_in, tgt_out = make_target_io([tgt[i] for i in index], t.pad_id, self.bos_id, t.eos_id)
        return pad_batch([src[i] for i in index], t.pad_id, eos_id=t.eos_id), tgt_in, tgt_out


# A prepared corpus folder (fairseq's binarized "mmap" datasets are the model); split is train, valid or test,
# side is src or tgt:
#     manifest.json         what was prepared from what (see minitf.nmt.prepare)
#     tokenizer.model       the joint BPE model the ids belong to
#     {split}.{side}.bin    the ids of every sentence, one after another, no BOS/EOS (raw little-endian uint16,
#                           or int32 for a vocabulary over 65,536)
#     {split}.{side}.idx    N + 1 int64 offsets: sentence i is bin[idx[i]:idx[i + 1]]
#     {split}.{side}.txt    valid and test only: the sentences as text (sources and references for BLEU)
# The arrays are memory-mapped read-only, so the ranks of mpiexec on one machine share one copy.
#: Bumped whenever the layout or the manifest's meaning changes; a folder of another version is refused.
FORMAT_VERSION = 1
SIDES = ("src", "tgt")
SPLITS = ("train", "valid", "test")


class SplitWriter:
    """Append encoded sentence pairs of one split to ``{split}.{side}.bin`` / ``.idx`` in a private ``folder``
    (renamed into place by the caller when complete); ``dtype`` from :func:`token_dtype`."""

    def __init__(self, folder, split, dtype):
        self.folder, self.split, self.dtype = pathlib.Path(folder), split, np.dtype(dtype)
        self._bins = {side: open(self.folder / f"{split}.{side}.bin", "wb") for side in SIDES}
        self._lengths = {side: [] for side in SIDES}  # one int32 array per chunk
        self.pairs = 0
        self.tokens = {side: 0 for side in SIDES}

    def add(self, src_ids, src_lens, tgt_ids, tgt_lens):
        """Append a chunk: flat ids (n_tokens,) and lengths (n_pairs,) per side."""
        for side, ids, lens in (("src", src_ids, src_lens), ("tgt", tgt_ids, tgt_lens)):
            ids = np.asarray(ids)
            lens = np.asarray(lens, dtype=np.int32)
            if int(lens.sum()) != ids.size:
                raise ValueError(f"{self.split}.{side}: {ids.size} ids but lengths sum to {int(lens.sum())}")
            self._bins[side].write(ids.astype(self.dtype, copy=False).tobytes())
            self._lengths[side].append(lens)
            self.tokens[side] += int(ids.size)
        self.pairs += len(src_lens)

    def close(self):
        """Write the offsets, flush everything to disk; returns the split's counts."""
        for side in SIDES:
            handle = self._bins[side]
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            lens = np.concatenate(self._lengths[side]) if self._lengths[side] else np.zeros(0, np.int32)
            offsets = np.zeros(lens.size + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            with open(self.folder / f"{self.split}.{side}.idx", "wb") as handle:
                handle.write(offsets.astype("<i8", copy=False).tobytes())
                handle.flush()
                os.fsync(handle.fileno())
        return dict(pairs=self.pairs, src_tokens=self.tokens["src"], tgt_tokens=self.tokens["tgt"])

    def abort(self):
        for handle in self._bins.values():
            handle.close()


class _Side:
    """The sentences of one split and side: ``len()`` and ``[i]`` (an id array); training never indexes it."""

    def __init__(self, flat, offsets):
        self.flat, self.offsets = flat, offsets

    def __len__(self):
        return self.offsets.size - 1

    def __getitem__(self, i):
        return np.asarray(self.flat[int(self.offsets[i]):int(self.offsets[i + 1])], dtype=np.int64)


class IndexedCorpus:
    """A folder of :func:`minitf.nmt.prepare.prepare_corpus` opened as a :class:`Corpus` is: ``tokenizer``,
    ``manifest``, ``text`` (valid and test), ``ids`` (``len()`` and ``[i]``); a batch is one vectorised read
    of the flat arrays. A DataError for anything but a whole folder of this format version."""

    def __init__(self, folder):
        self.folder = folder = pathlib.Path(folder)
        self.manifest = read_manifest(folder)  # every field checked: no KeyError or TypeError below
        path = inside_folder(folder, "tokenizer.model")
        model = path.read_bytes() if path.is_file() else None
        if model is None or hashlib.sha256(model).hexdigest() != self.manifest["tokenizer_sha256"]:
            what = "is missing" if model is None else "is not the tokenizer its manifest names (it was replaced)"
            raise damaged_file(path, what)
        self.tokenizer = Tokenizer.from_bytes(model)
        vocab = self.manifest["vocab_size"]
        if self.tokenizer.vocab_size != vocab:
            raise damaged_file(path, f"has {self.tokenizer.vocab_size} ids, its manifest says {vocab}")
        dtype = np.dtype(self.manifest["dtype"])
        self.text, self.ids = {}, {}
        self._flat, self._offsets, self._lengths = {}, {}, {}
        for split, counts in self.manifest["splits"].items():
            n = counts["pairs"]
            sides = []
            for side in SIDES:
                offsets = map_array(folder, f"{split}.{side}.idx", np.dtype("<i8"), n + 1)
                flat = map_array(folder, f"{split}.{side}.bin", dtype, counts[f"{side}_tokens"])
                check_offsets(offsets, flat.size, folder / f"{split}.{side}.idx")
                check_ids(flat, vocab, folder / f"{split}.{side}.bin")
                self._flat[split, side], self._offsets[split, side] = flat, offsets
                sides.append(_Side(flat, offsets))
            self.ids[split] = tuple(sides)
            if (folder / f"{split}.src.txt").is_file():
                self.text[split] = tuple(_read_text(folder, f"{split}.{side}.txt", n) for side in SIDES)

    def set_bpe_dropout(self, p):
        """BPE-dropout re-segments the text every epoch; a prepared corpus holds ids only."""
        if p > 0:
            raise DataError(f"--bpe-dropout {p} needs the training text, but a prepared corpus holds token ids "
                            "only; use --bpe-dropout 0 (the paper's recipe) or train from text files")

    def start_epoch(self, seed, epoch):
        """Nothing changes between epochs (no BPE-dropout)."""

    def lengths(self, split):
        """Host int64 arrays (N,), (N,): tokens per sentence with EOS (source) and BOS (target), from the offsets."""
        if split not in self._lengths:
            self._lengths[split] = tuple(np.diff(self._offsets[split, side]) + 1 for side in SIDES)
        return self._lengths[split]

    def batch(self, split, index):
        """Host int64 arrays src (B, S), tgt_in (B, T), tgt_out (B, T), padded as :meth:`Corpus.batch` pads them."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        if index.size == 0:
            raise DataError("a batch needs at least one sentence index, got none")
        src_ids, src_lens = self._gather(split, "src", index)        # (B, S-1), (B,)
        tgt_ids, tgt_lens = self._gather(split, "tgt", index)        # (B, T-1), (B,)
        rows = np.arange(index.size)
        src = _pad_right(src_ids, 1)                                  # (B, S)
        src[rows, src_lens] = EOS_ID
        tgt_out = _pad_right(tgt_ids, 1)                              # (B, T)
        tgt_out[rows, tgt_lens] = EOS_ID
        tgt_in = np.full_like(tgt_out, PAD_ID)                        # (B, T)
        tgt_in[:, 0] = BOS_ID
        tgt_in[:, 1:] = tgt_ids
        return src, tgt_in, tgt_out

    def _gather(self, split, side, index):
        """The ids of sentences ``index`` as a PAD-filled int64 matrix (B, max length), and
        their lengths (B,): one fancy-indexed read of the memory map, no loop."""
        offsets, flat = self._offsets[split, side], self._flat[split, side]
        starts = np.asarray(offsets[index])                           # (B,)
        lens = np.asarray(offsets[index + 1]) - starts                # (B,)
        width = int(lens.max())
        cols = np.arange(width)
        inside = cols[None, :] < lens[:, None]                        # (B, L)
        out = np.full((index.size, width), PAD_ID, dtype=np.int64)    # (B, L)
        out[inside] = flat[(starts[:, None] + cols[None, :])[inside]]
        return out, lens

    def __repr__(self):
        counts = {s: c["pairs"] for s, c in self.manifest["splits"].items()}
        return f"IndexedCorpus({str(self.folder)!r}, pairs={counts})"


def _pad_right(ids, extra):
    """``ids`` (B, L) with ``extra`` PAD columns appended: (B, L + extra)."""
    out = np.full((ids.shape[0], ids.shape[1] + extra), PAD_ID, dtype=np.int64)
    out[:, :ids.shape[1]] = ids
    return out


def _read_text(folder, name, n):
    path = inside_folder(folder, name)
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as error:
        raise damaged_file(path, f"cannot be read as UTF-8 text ({error})") from None
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != n:
        raise damaged_file(path, f"has {len(lines)} lines, its manifest says {n}")
    return lines


def _is_count(value, least=0):
    return type(value) is int and value >= least  # noqa: E721 (JSON's true and 1.0 are not counts)


def check_manifest(manifest, path):
    """Refuse a manifest (parsed JSON) with any field missing or of the wrong type or value, so that
    nothing that reads it meets a KeyError, a TypeError or a path outside its folder."""
    def refuse(field, value, expected):
        raise damaged_file(path, f"has {field} = {reprlib.repr(value)}, expected {expected}")

    recipe = manifest.get("recipe")
    if not isinstance(recipe, dict):
        refuse("recipe", recipe, "an object (the sources and settings it was prepared with)")
    languages = recipe.get("languages")
    if not (isinstance(languages, list) and len(languages) == 2
            and all(isinstance(lang, str) and lang for lang in languages)):
        refuse("recipe.languages", languages, "two language codes, e.g. [\"en\", \"de\"]")
    digest = manifest.get("tokenizer_sha256")
    if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        refuse("tokenizer_sha256", digest, "64 hexadecimal digits")
    vocab = manifest.get("vocab_size")
    if not _is_count(vocab, 1):
        refuse("vocab_size", vocab, "a positive integer")
    if manifest.get("dtype") != token_dtype(vocab):
        refuse("dtype", manifest.get("dtype"), f"{token_dtype(vocab)!r} for a vocabulary of {vocab}")
    splits = manifest.get("splits")
    if not isinstance(splits, dict):
        refuse("splits", splits, "an object of train, valid and (optionally) test")
    for split in splits:
        if split not in SPLITS:
            refuse("a split named", split, "only train, valid and test")
    for split in ("train", "valid"):
        if split not in splits:
            refuse("splits", sorted(splits), f"a {split} split")
    for split, counts in splits.items():
        if not isinstance(counts, dict):
            refuse(f"splits.{split}", counts, "an object of pairs, src_tokens and tgt_tokens")
        for key, least in (("pairs", 1), ("src_tokens", 0), ("tgt_tokens", 0)):
            if not _is_count(counts.get(key), least):
                refuse(f"splits.{split}.{key}", counts.get(key), f"an integer >= {least}")
    if not isinstance(manifest.get("cleaning"), dict):
        refuse("cleaning", manifest.get("cleaning"), "an object (what cleaning kept and dropped)")


def read_manifest(folder):
    """The manifest of a prepared folder, every field checked (:func:`check_manifest`), with a one-line
    DataError for anything else."""
    path, manifest = load_manifest(folder, "prepared corpus",
                                   "train.py --train-src ... --corpus-dir DIR, or --corpus wmt14-en-de")
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if not _is_count(version) or version != FORMAT_VERSION:
        raise damaged_file(path, f"has format version {reprlib.repr(version)}, this minitf reads version {FORMAT_VERSION}")
    check_manifest(manifest, path)
    return manifest
