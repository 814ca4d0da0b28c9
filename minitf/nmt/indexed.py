"""A prepared corpus on disk: token ids in memory-mapped flat arrays, read by training
without a Python object per sentence.

Layout of a prepared folder (fairseq's binarized "mmap" datasets are the model)::

    manifest.json            what was prepared from what (see minitf.nmt.prepare)
    tokenizer.model          the joint BPE model the ids belong to
    {split}.{side}.bin       the ids of every sentence of a split and side, one after
                             another (raw little-endian uint16, or int32 for a
                             vocabulary over 65,536), no BOS/EOS
    {split}.{side}.idx       int64 offsets, N + 1 of them: sentence i is
                             bin[idx[i]:idx[i + 1]]
    {split}.{side}.txt       valid and test only: the sentences as text (sources and
                             references for BLEU)

``split`` is train, valid or test and ``side`` is src or tgt. The arrays are opened
with ``numpy.memmap`` read-only, so the ranks of ``mpiexec`` on one machine share one
copy through the page cache. Token-count batches are computed from the lengths
(differences of the offsets) with :func:`minitf.nmt.data.token_batches`, and a batch
is gathered from the flat arrays with one vectorised read: :class:`IndexedCorpus`
hands the trainer the same arrays as the in-memory :class:`minitf.nmt.data.Corpus`.
"""
import json
import os
import pathlib

from minitf.backend import host as np
from minitf.nmt.errors import DataError
from minitf.nmt.files import fsync_dir
from minitf.nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

#: Bumped whenever the layout or the manifest's meaning changes; a folder of another version is refused.
FORMAT_VERSION = 1
SPLITS = ("train", "valid", "test")
SIDES = ("src", "tgt")


def token_dtype(vocab_size):
    """The smallest id type for a vocabulary: uint16 up to 65,536 ids, else int32."""
    return "uint16" if int(vocab_size) <= 1 << 16 else "int32"


# --------------------------------------------------------------------------- writing

class SplitWriter:
    """Append encoded sentence pairs of one split to ``{split}.{side}.bin`` / ``.idx``.

    Parameters
    ----------
    folder : pathlib.Path
        A private folder being built (the caller renames the whole folder into place
        when it is complete, so no reader ever sees a half-written split).
    split : str
    dtype : str
        From :func:`token_dtype`.
    """

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
            _fsync(handle)
            handle.close()
            lens = np.concatenate(self._lengths[side]) if self._lengths[side] else np.zeros(0, np.int32)
            offsets = np.zeros(lens.size + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            with open(self.folder / f"{self.split}.{side}.idx", "wb") as handle:
                handle.write(offsets.astype("<i8", copy=False).tobytes())
                handle.flush()
                _fsync(handle)
        return dict(pairs=self.pairs, src_tokens=self.tokens["src"], tgt_tokens=self.tokens["tgt"])

    def abort(self):
        for handle in self._bins.values():
            handle.close()


def _fsync(handle):
    os.fsync(handle.fileno())


def finish_folder(folder):
    """Flush a built folder's entries before it is renamed into place."""
    fsync_dir(folder)


# --------------------------------------------------------------------------- reading

class _Side:
    """The sentences of one split and side: ``len()`` and ``[i]`` (an id array), for
    code that asks ``len(corpus.ids["train"][0])``; training itself never indexes it."""

    def __init__(self, flat, offsets):
        self.flat, self.offsets = flat, offsets

    def __len__(self):
        return self.offsets.size - 1

    def __getitem__(self, i):
        return np.asarray(self.flat[int(self.offsets[i]):int(self.offsets[i + 1])], dtype=np.int64)


class IndexedCorpus:
    """A prepared folder opened for training: the interface of :class:`minitf.nmt.data.Corpus`.

    Parameters
    ----------
    folder : str or path-like
        Written by :func:`minitf.nmt.prepare.prepare_corpus`.

    Attributes
    ----------
    tokenizer : minitf.nmt.tokenizer.Tokenizer
        The prepared folder's tokenizer (its ids are the ones in the arrays).
    manifest : dict
    text : dict
        ``{split: (sources, references)}`` for valid and test (lists of str).
    ids : dict
        ``{split: (src, tgt)}``, each with ``len()`` and ``[i]``.

    Raises
    ------
    DataError
        Not a prepared folder, another format version, a missing or truncated array,
        or a tokenizer that is not the one the manifest names.
    """

    def __init__(self, folder):
        self.folder = folder = pathlib.Path(folder)
        self.manifest = read_manifest(folder)
        self.tokenizer = Tokenizer(folder / "tokenizer.model")
        if self.tokenizer.sha256 != self.manifest["tokenizer_sha256"]:
            raise DataError(f"prepared corpus {str(folder)!r}: tokenizer.model is not the tokenizer its "
                            "manifest names (it was replaced); prepare the corpus again")
        dtype = np.dtype(self.manifest["dtype"])
        self.text, self.ids = {}, {}
        self._flat, self._offsets, self._lengths = {}, {}, {}
        for split, counts in self.manifest["splits"].items():
            n = counts["pairs"]
            sides = []
            for side in SIDES:
                offsets = _map(folder / f"{split}.{side}.idx", np.dtype("<i8"), n + 1)
                flat = _map(folder / f"{split}.{side}.bin", dtype, counts[f"{side}_tokens"])
                if int(offsets[-1]) != flat.size:
                    raise DataError(f"prepared corpus {str(folder)!r}: {split}.{side}.idx ends at {int(offsets[-1])}"
                                    f" but {split}.{side}.bin holds {flat.size} ids; prepare the corpus again")
                self._flat[split, side], self._offsets[split, side] = flat, offsets
                sides.append(_Side(flat, offsets))
            self.ids[split] = tuple(sides)
            if (folder / f"{split}.src.txt").is_file():
                self.text[split] = tuple(_read_text(folder / f"{split}.{side}.txt", n) for side in SIDES)

    # -- what the trainer calls ---------------------------------------------------
    def set_bpe_dropout(self, p):
        """BPE-dropout re-segments the text every epoch; a prepared corpus holds ids only."""
        if p > 0:
            raise DataError(f"--bpe-dropout {p} needs the training text, but a prepared corpus holds token ids "
                            "only; use --bpe-dropout 0 (the paper's recipe) or train from text files")

    def start_epoch(self, seed, epoch):
        """Nothing changes between epochs (no BPE-dropout)."""

    def lengths(self, split):
        """Host int64 arrays (N,), (N,): tokens per sentence with EOS (source) and BOS (target)
        added, computed once from the offsets."""
        if split not in self._lengths:
            self._lengths[split] = tuple(np.diff(self._offsets[split, side]) + 1 for side in SIDES)
        return self._lengths[split]

    def batch(self, split, index):
        """Host int64 arrays (src (B, S), tgt_in (B, T), tgt_out (B, T)) for sentence indices,
        exactly as :meth:`minitf.nmt.data.Corpus.batch` pads them."""
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


def _map(path, dtype, count):
    """A read-only memory map of ``count`` items, refusing a missing or wrong-sized file."""
    expected = int(count) * dtype.itemsize
    if not path.is_file():
        raise DataError(f"prepared corpus file {str(path)!r} is missing; prepare the corpus again")
    size = path.stat().st_size
    if size != expected:
        raise DataError(f"prepared corpus file {str(path)!r} has {size} bytes, its manifest says {expected}; "
                        "it was truncated or replaced, prepare the corpus again")
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(int(count),))


def _read_text(path, n):
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != n:
        raise DataError(f"prepared corpus file {str(path)!r} has {len(lines)} lines, its manifest says {n}; "
                        "prepare the corpus again")
    return lines


def read_manifest(folder):
    """The manifest of a prepared folder, with a one-line DataError for anything else."""
    folder = pathlib.Path(folder)
    path = folder / "manifest.json"
    if not path.is_file():
        what = "does not exist" if not folder.exists() else "has no manifest.json"
        raise DataError(f"prepared corpus {str(folder)!r} {what}; prepare it first "
                        "(minitf.nmt.prepare.prepare_corpus, or train.py --corpus wmt14-en-de)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"prepared corpus {str(folder)!r}: manifest.json is not valid JSON ({error}); "
                        "prepare the corpus again") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise DataError(f"prepared corpus {str(folder)!r} has format version {version!r}, this minitf reads "
                        f"version {FORMAT_VERSION}; prepare the corpus again")
    return manifest
