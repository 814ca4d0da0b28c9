"""Host-side data pipeline: corpus fetch, Ding parsing, reading, splitting, batching.

Everything here runs on the CPU with plain NumPy (``minitf.backend.host``); the
training loop copies finished batches to the device. Every bad-input error that
crosses this boundary is a :class:`DataError` with a one-line message saying what
was expected, what came and what to do.
"""
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

from minitf.backend import host as np

#: Where the Ding dictionary lives inside the Debian package ``trans-de-en``.
DING_PACKAGE = "trans-de-en"
DING_MEMBER = pathlib.Path("usr/share/trans/de-en")

#: Longest line (in characters) accepted by :func:`read_lines` by default.
MAX_CHARS = 10_000

_CORPUS_HINT = ("pass your own corpus with --train-src/--train-tgt --valid-src/--valid-tgt "
                "(plain UTF-8 text, one sentence per line)")


class DataError(ValueError):
    """Bad input at the data boundary (missing file, bad encoding, misaligned corpus...)."""


class Pairs(list):
    """A list of ``(source, target)`` pairs that also remembers how many were dropped.

    Attributes
    ----------
    n_dropped : int
        Line pairs skipped because the source or the target line was empty.
    """

    def __init__(self, pairs=(), n_dropped=0):
        super().__init__(pairs)
        self.n_dropped = int(n_dropped)


# --------------------------------------------------------------------------- fetch

def fetch_default_corpus(cache_dir):
    """Return the path of the Ding de-en dictionary, fetching it with apt if needed.

    Parameters
    ----------
    cache_dir : str or path-like
        Folder that holds ``trans-de-en/usr/share/trans/de-en`` once fetched.

    Returns
    -------
    pathlib.Path
        The dictionary file (UTF-8 text in Ding format, see :func:`parse_ding`).

    Raises
    ------
    DataError
        apt-get or dpkg-deb is unavailable, the package is unknown, or the fetch fails.
    """
    cache_dir = pathlib.Path(cache_dir)
    final_dir = cache_dir / DING_PACKAGE
    corpus = final_dir / DING_MEMBER
    if corpus.is_file():
        return corpus
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise DataError(f"the default corpus needs {tool} (Debian package {DING_PACKAGE}), "
                            f"but apt is unavailable on this machine; {_CORPUS_HINT}")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create the corpus cache folder {str(cache_dir)!r} ({error}); "
                        "pass a writable --cache-dir") from None
    # Work in a private temp folder and rename the finished tree into place, so an
    # interrupted fetch never leaves a half-extracted corpus behind.
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{DING_PACKAGE}-", dir=cache_dir))
    try:
        deb = _apt_download(work)
        extracted = work / "root"
        _run(["dpkg-deb", "-x", str(deb), str(extracted)], cwd=work, what="dpkg-deb -x")
        if not (extracted / DING_MEMBER).is_file():
            raise DataError(f"package {DING_PACKAGE} has no {DING_MEMBER}; the package layout "
                            f"changed, so {_CORPUS_HINT}")
        if final_dir.exists() and not corpus.is_file():
            shutil.rmtree(final_dir)  # a stale tree without the corpus: ours to replace
        try:
            os.rename(extracted, final_dir)
        except OSError:
            if not corpus.is_file():  # not a concurrent fetch that won the race
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return corpus


def _apt_download(work):
    """Run ``apt-get download`` in ``work`` and return the path of the .deb."""
    try:
        _run(["apt-get", "download", DING_PACKAGE], cwd=work, what="apt-get download")
    except DataError as error:
        detail = str(error).split("; ")[0].removeprefix("apt-get download failed: ")
        if "Unable to locate package" in detail or detail.startswith("E:"):
            raise DataError(f"apt-get cannot get package {DING_PACKAGE} ({detail}): run "
                            f"`apt-get update` first (as root), or {_CORPUS_HINT}") from None
        raise
    debs = sorted(work.glob(f"{DING_PACKAGE}_*.deb"))
    if not debs:
        raise DataError(f"apt-get download {DING_PACKAGE} reported success but wrote no .deb; "
                        f"{_CORPUS_HINT}")
    return debs[0]


def _run(command, cwd, what):
    """Run a command quietly; any failure becomes a one-line DataError."""
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                                timeout=600, check=False)
    except FileNotFoundError:
        raise DataError(f"{command[0]} is not installed, so apt is unavailable; "
                        f"{_CORPUS_HINT}") from None
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DataError(f"{what} failed ({error}); {_CORPUS_HINT}") from None
    if result.returncode != 0:
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("E:")]
        detail = (errors or lines or [f"exit status {result.returncode}"])[-1].strip()
        raise DataError(f"{what} failed: {detail}; {_CORPUS_HINT}")
    return result


# --------------------------------------------------------------------------- parse Ding

# Annotations Ding puts around words: {f}, {m}, {vt}, [ugs.], [Br.], (explanations).
_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|\([^()]*\)")
# Placeholders mark a phrase pattern, not a sentence ("jdm. etw. geben", "to give sb. sth.").
_PLACEHOLDER = re.compile(r"(?<!\w)(?:etw|jdn|jdm|jds|sth|sb|so)\.|(?<!\w)sb['’]s(?!\w)|\.\.\.|…")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")


def _clean(text):
    """Strip Ding annotations and collapse whitespace."""
    previous = None
    while previous != text:  # nested brackets, e.g. "(a (b) c)"
        previous, text = text, _ANNOTATION.sub(" ", text)
    text = " ".join(text.split())
    return _SPACE_BEFORE_PUNCT.sub(r"\1", text)


def _is_sentence(text):
    """True for a whole sentence: capitalised, >= 3 words, final . ! ?, no placeholders."""
    return (len(text) > 0 and text[0].isupper() and text[-1] in ".!?"
            and len(text.split()) >= 3 and not _PLACEHOLDER.search(text))


def _line_pairs(line):
    """The sentence pairs of one Ding line (``de | de :: en | en``), in order."""
    if " :: " not in line:
        return []
    german, english = line.split(" :: ", 1)
    de_entries, en_entries = german.split(" | "), english.split(" | ")
    if len(de_entries) != len(en_entries):
        return []
    pairs = []
    for de_entry, en_entry in zip(de_entries, en_entries):
        de_syns, en_syns = de_entry.split("; "), en_entry.split("; ")
        if len(de_syns) != len(en_syns):
            if len(de_syns) != 1 and len(en_syns) != 1:
                continue
            # one sentence against several synonym translations: pair it with the first
            de_syns, en_syns = de_syns[:1], en_syns[:1]
        for de, en in zip(de_syns, en_syns):
            if _PLACEHOLDER.search(de) or _PLACEHOLDER.search(en):
                continue  # checked before cleaning too: "(etw.)" marks a pattern
            de, en = _clean(de), _clean(en)
            if _is_sentence(de) and _is_sentence(en):
                pairs.append((de, en))
    return pairs


def parse_ding(path):
    """Extract whole-sentence German-English pairs from a Ding dictionary file.

    Lines look like ``de1 | de2 :: en1 | en2`` (``#`` starts a comment). Sub-entries
    pair up by position (a line whose sides have different counts is skipped);
    inside a sub-entry ``; `` separates synonyms, paired by position when both
    sides have as many, and a single entry against several is paired with the first. A pair is kept when both sides are whole sentences: an
    uppercase first letter, at least 3 words, a final ``.``, ``!`` or ``?``, and no
    placeholder (``etw.``, ``jdm.``, ``sth.``, ``sb.``, ``...``). Annotations
    (``{f}``, ``[ugs.]``, ``(...)``) are stripped and whitespace collapsed.

    Parameters
    ----------
    path : str or path-like
        The dictionary (UTF-8), e.g. from :func:`fetch_default_corpus`.

    Returns
    -------
    list of (str, str)
        Unique ``(german, english)`` pairs in order of first occurrence.
    """
    seen, pairs = set(), []
    for line in read_lines(path, "Ding dictionary", max_chars=None):
        if not line or line.startswith("#"):
            continue
        for pair in _line_pairs(line):
            if pair not in seen:
                seen.add(pair)
                pairs.append(pair)
    return pairs


def split_pairs(pairs, seed=1234, n_valid=500, n_test=500):
    """Shuffle a copy of ``pairs`` and cut it into train, valid and test.

    Parameters
    ----------
    pairs : sequence
        The items to split (left untouched).
    seed : int
        Seed of the shuffle; the same seed always gives the same split.
    n_valid, n_test : int
        Sizes of the validation and test sets; train gets the rest.

    Returns
    -------
    train, valid, test : list
    """
    n_valid, n_test = int(n_valid), int(n_test)
    if n_valid < 0 or n_test < 0:
        raise DataError(f"split sizes must be >= 0, got n_valid={n_valid}, n_test={n_test}")
    if n_valid + n_test >= len(pairs):
        raise DataError(f"cannot hold out {n_valid} valid + {n_test} test pairs from only "
                        f"{len(pairs)} pairs; use a bigger corpus or smaller held-out sets")
    order = np.random.default_rng(seed).permutation(len(pairs))
    shuffled = [pairs[i] for i in order.tolist()]
    valid, test = shuffled[:n_valid], shuffled[n_valid:n_valid + n_test]
    return shuffled[n_valid + n_test:], valid, test


# --------------------------------------------------------------------------- read / write

def read_lines(path, what="input", max_chars=MAX_CHARS):
    """Read a UTF-8 text file as a list of stripped lines (empty lines kept).

    Lines are split on ``\\n`` only (``\\r\\n`` is accepted), so line numbers match
    ``wc -l`` and parallel files stay aligned; a leading BOM is ignored.

    Parameters
    ----------
    path : str or path-like
    what : str
        Name of the file's role for error messages, e.g. ``"source"``.
    max_chars : int or None
        Longest accepted line; None for no limit.

    Returns
    -------
    list of str

    Raises
    ------
    DataError
        Missing file, a directory, an empty file, invalid UTF-8, a too-long line,
        or a file with only empty lines.
    """
    path = pathlib.Path(path)
    data = _read_bytes(path, what)
    if not data:
        raise DataError(f"{what} file {str(path)!r} is empty (0 bytes); "
                        "expected plain text with one sentence per line")
    lines = decode_lines(data, f"{what} file {str(path)!r}", max_chars)
    if not any(lines):
        raise DataError(f"{what} file {str(path)!r} has only empty lines; "
                        "expected plain text with one sentence per line")
    return lines


def decode_lines(data, origin, max_chars=MAX_CHARS):
    """Split UTF-8 bytes into stripped lines as :func:`read_lines` does (for stdin, say).

    Parameters
    ----------
    data : bytes
    origin : str
        What the bytes are, for error messages, e.g. ``"standard input"``.
    max_chars : int or None
        Longest accepted line; None for no limit.

    Raises
    ------
    DataError
        Invalid UTF-8 or a too-long line. Empty input gives ``[]``.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_no = data.count(b"\n", 0, error.start) + 1
        raise DataError(f"{origin} is not valid UTF-8 at line {line_no} "
                        f"(byte {error.object[error.start:error.start + 1]!r}); "
                        "re-encode it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    lines = [line.strip() for line in lines]
    if max_chars is not None:
        for number, line in enumerate(lines, start=1):
            if len(line) > max_chars:
                raise DataError(f"{origin}: line {number} has {len(line)} "
                                f"characters, more than the limit {max_chars}; expected one "
                                "sentence per line, split or drop that line")
    return lines


def _read_bytes(path, what):
    """The bytes of a file, with a DataError for anything that is not a readable file."""
    hint = "expected a plain text file with one sentence per line"
    if not path.exists():
        raise DataError(f"{what} file {str(path)!r} does not exist; {hint}, check the path")
    if path.is_dir():
        raise DataError(f"{what} path {str(path)!r} is a directory; {hint}, pass the file inside it")
    try:
        return path.read_bytes()
    except OSError as error:
        raise DataError(f"cannot read {what} file {str(path)!r} ({error.strerror or error}); "
                        f"{hint}, check its permissions") from None


def read_parallel(src_path, tgt_path, max_chars=MAX_CHARS):
    """Read an aligned source/target corpus (line *i* of one translates line *i* of the other).

    Parameters
    ----------
    src_path, tgt_path : str or path-like
        UTF-8 text files with one sentence per line and the same number of lines.
    max_chars : int or None
        Longest accepted line.

    Returns
    -------
    Pairs
        A list of ``(source, target)`` pairs; line pairs where either side is empty
        are dropped and counted in its ``n_dropped`` attribute.

    Raises
    ------
    DataError
        Any problem of :func:`read_lines`, or a line-count mismatch.
    """
    src = read_lines(src_path, "source", max_chars)
    tgt = read_lines(tgt_path, "target", max_chars)
    if len(src) != len(tgt):
        raise DataError(f"source {str(src_path)!r} has {len(src)} lines but target "
                        f"{str(tgt_path)!r} has {len(tgt)}; parallel files need one "
                        "translation per line, so fix the alignment")
    pairs = [(s, t) for s, t in zip(src, tgt) if s and t]
    if not pairs:
        raise DataError(f"no line of {str(src_path)!r} / {str(tgt_path)!r} has both a source "
                        "and a target sentence; check that the files are aligned")
    return Pairs(pairs, n_dropped=len(src) - len(pairs))


def write_lines(path, lines):
    """Write one line per item, atomically (temp file in the same folder, then rename).

    Parameters
    ----------
    path : str or path-like
    lines : iterable of str
        Items must not contain a newline (that would shift a parallel file).
    """
    path = pathlib.Path(path)
    lines = list(lines)
    for number, line in enumerate(lines, start=1):
        if "\n" in line or "\r" in line:
            raise DataError(f"line {number} for {str(path)!r} contains a newline; "
                            "expected one sentence per item, remove the line break")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.writelines(line + "\n" for line in lines)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- batching

def token_batches(src_lens, tgt_lens, max_tokens, seed, epoch, max_len=None):
    """Group sentence indices into batches of similar length under a token budget.

    Sentences are sorted by (source length, target length) with random tie-breaking,
    consecutive runs are cut so that ``max(len) * count <= max_tokens`` holds for the
    source and for the target side (a single sentence over the budget forms its own
    batch), and the batch order is shuffled. The randomness comes from a generator
    seeded by ``(seed, epoch)``: the same pair gives the same batches, another epoch
    another order.

    Parameters
    ----------
    src_lens, tgt_lens : sequence of int
        Lengths in tokens, counting any BOS/EOS the padded batch will carry.
    max_tokens : int
        Budget of padded tokens per batch and side.
    seed, epoch : int
    max_len : int or None
        Sentences longer than this on either side are skipped.

    Returns
    -------
    batches : list of ndarray of int64
        Indices into the length arrays, one array per batch.
    n_skipped : int
        Sentences left out because of ``max_len``.
    """
    src = np.asarray(src_lens, dtype=np.int64).reshape(-1)
    tgt = np.asarray(tgt_lens, dtype=np.int64).reshape(-1)
    if src.shape != tgt.shape:
        raise DataError(f"token_batches needs one target length per source length, "
                        f"got {src.size} and {tgt.size}")
    if int(max_tokens) < 1:
        raise DataError(f"max_tokens must be a positive number of tokens, got {max_tokens}; "
                        "raise --max-tokens")
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
    """Stack token sequences into a right-padded int64 matrix.

    Parameters
    ----------
    seqs : sequence of sequence of int
    pad_id : int
    bos_id, eos_id : int or None
        When given, prepended / appended to every sequence before padding.

    Returns
    -------
    ndarray of int64, shape (B, L)
        ``L`` is the longest sequence plus the added BOS/EOS.
    """
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
    """Decoder input and expected output for teacher forcing.

    Returns
    -------
    tgt_in, tgt_out : ndarray of int64, shape (B, L)
        ``tgt_in`` is ``[bos] + seq`` and ``tgt_out`` is ``seq + [eos]``, both padded
        to the same length, so ``tgt_out[:, t]`` is the token to predict after
        reading ``tgt_in[:, :t + 1]``.
    """
    return pad_batch(seqs, pad_id, bos_id=bos_id), pad_batch(seqs, pad_id, eos_id=eos_id)
