"""Text and token files any model trains on (host NumPy): reading UTF-8 text safely, writing lines
atomically, and memory-mapped token arrays with the checks that refuse a damaged one. Bad input is a one-line
DataError saying what was expected, what came and what to do."""
import glob
import json
import sys
import os
import pathlib
import re
import shutil
import tempfile

try:  # the lock that tells a live preparation's temp folder from a killed one's
    import fcntl
except ImportError:  # not POSIX: temp folders of killed preparations are not told apart, so none is removed
    fcntl = None

from minitf.backend import host as np
from minitf.training.errors import DataError
from minitf.training.files import write_atomic

#: Longest line (in characters) accepted by :func:`read_lines` by default.
MAX_CHARS = 10_000
#: A character that is text: not a space, not a control character (C0, DEL, C1: a zero-filled file's NULs, a
#: terminal's escapes) and not an invisible format character (soft hyphen, zero-width and direction marks, BOM).
_VISIBLE = re.compile("[^\\s\x00-\x1f\x7f-\x9f\xad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]")


def read_lines(path, what="input", max_chars=MAX_CHARS):
    """A UTF-8 text file as stripped lines (empty ones kept), split on ``\\n`` only so that line numbers match
    ``wc -l`` (a BOM ignored); ``what`` names its role in errors, ``max_chars`` is the longest line (None: any).
    A DataError for a missing, empty, non-UTF-8 or all-blank file (control characters count as blank), a
    directory, or a too-long line."""
    path = pathlib.Path(path)
    data = _read_bytes(path, what)
    if not data:
        raise DataError(f"{what} file {str(path)!r} is empty (0 bytes); expected plain text with one sentence per line")
    lines = decode_lines(data, f"{what} file {str(path)!r}", max_chars)
    if not any(_VISIBLE.search(line) for line in lines):  # blank, or a zero-filled file
        raise DataError(f"{what} file {str(path)!r} has only empty lines (or blanks and control characters); "
                        "expected plain text with one sentence per line")
    return lines


def read_text(path, what="input"):
    """A whole UTF-8 text file as one string (a BOM dropped, line ends kept: a language model learns them);
    ``what`` names its role in errors. A DataError for a missing, empty, non-UTF-8 or all-blank file (control
    characters, such as a zero-filled file's NULs, count as blank) or a directory."""
    path = pathlib.Path(path)
    data = _read_bytes(path, what, hint="expected a plain UTF-8 text file")
    if not data:
        raise DataError(f"{what} file {str(path)!r} is empty (0 bytes); expected a plain UTF-8 text file")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line_no = data.count(b"\n", 0, error.start) + 1
        raise DataError(f"{what} file {str(path)!r} is not valid UTF-8 at line {line_no} "
                        f"(byte {error.object[error.start:error.start + 1]!r}); "
                        "re-encode it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    if not _VISIBLE.search(text):  # blanks, or a zero-filled file (what a crash can leave)
        raise DataError(f"{what} file {str(path)!r} has no text ({len(data)} bytes of blanks and control "
                        "characters); expected a plain UTF-8 text file")
    return text


def decode_lines(data, origin, max_chars=MAX_CHARS):
    """Split UTF-8 bytes into stripped lines as :func:`read_lines` does (for stdin, say); ``origin`` names
    them in errors (``"standard input"``). Empty input gives ``[]``."""
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
                raise DataError(f"{origin}: line {number} has {len(line)} characters, more than the limit "
                                f"{max_chars}; expected one sentence per line, split or drop that line")
    return lines


def _read_bytes(path, what, hint="expected a plain text file with one sentence per line"):
    """The bytes of a file, with a DataError for anything that is not a readable file."""
    if not path.exists():
        raise DataError(f"{what} file {str(path)!r} does not exist; {hint}, check the path")
    if path.is_dir():
        raise DataError(f"{what} path {str(path)!r} is a directory; {hint}, pass the file inside it")
    try:
        return path.read_bytes()
    except OSError as error:
        raise DataError(f"cannot read {what} file {str(path)!r} ({error.strerror or error}); "
                        f"{hint}, check its permissions") from None


def write_lines(path, lines):
    """Write one line per item, atomically; an item with a newline (it would shift a parallel file) is refused."""
    path = pathlib.Path(path)
    lines = list(lines)
    for number, line in enumerate(lines, start=1):
        if "\n" in line or "\r" in line:
            raise DataError(f"line {number} for {str(path)!r} contains a newline; "
                            "expected one sentence per item, remove the line break")
    write_atomic(path, "".join(line + "\n" for line in lines))


def token_dtype(vocab_size):
    """The smallest id type for a vocabulary: uint16 up to 65,536 ids, else int32."""
    return "uint16" if int(vocab_size) <= 1 << 16 else "int32"


#: What a damaged or foreign prepared folder's error says to do: the command-line flag, the one step that prepares
#: it again (library callers: ``prepare_corpus(..., rebuild=True)``).
PREPARE_AGAIN = ("prepare the corpus again: train.py --prepare-again with the data flags that made it "
                 "(--train-src ... or --model gpt --train-text ... with --corpus-dir DIR, or --corpus wmt14-en-de)")
#: Offsets and ids are checked this many at a time when a folder is opened: memory stays bounded whatever its size.
VERIFY_CHUNK = 1 << 22


def damaged_file(path, what):
    return DataError(f"prepared corpus file {str(path)!r} {what}; {PREPARE_AGAIN}")


def inside_folder(folder, name):
    """``folder / name``, refused when it is a link that leads out of ``folder``."""
    path = folder / name
    if path.is_symlink() and pathlib.Path(os.path.realpath(path)).parent != pathlib.Path(os.path.realpath(folder)):
        raise damaged_file(path, f"is a link to {os.path.realpath(path)!r}, outside the folder")
    return path


def map_array(folder, name, dtype, count):
    """A read-only memory map of ``count`` items of ``folder / name``, refusing a missing or wrong-sized file."""
    path = inside_folder(folder, name)
    expected = int(count) * dtype.itemsize
    if not path.is_file():
        raise damaged_file(path, "is missing")
    size = path.stat().st_size
    if size != expected:
        raise damaged_file(path, f"has {size} bytes, its manifest says {expected} (it was truncated or replaced)")
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(int(count),))


def check_offsets(offsets, n_ids, path, chunk=None):
    """Refuse offsets (N + 1,) that do not cut ``n_ids`` ids into N rows: they must start at 0, never decrease
    and end at ``n_ids`` (so each lies within the ids and no row has a negative length), checked ``chunk``
    (default :data:`VERIFY_CHUNK`) at a time, each slice overlapping the next by one."""
    chunk = chunk or VERIFY_CHUNK
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0:
        raise damaged_file(path, f"starts at offset {first}, not 0")
    for start in range(0, offsets.size - 1, chunk):
        part = np.asarray(offsets[start:start + chunk + 1])
        beyond = np.flatnonzero(part > n_ids)
        if beyond.size:
            raise damaged_file(path, f"has offset {int(part[beyond[0]])} at index {start + int(beyond[0])}, past the "
                               f"end of the {n_ids} ids of its .bin")
        falls = np.flatnonzero(part[1:] < part[:-1])
        if falls.size:
            i = start + int(falls[0])
            raise damaged_file(path, f"has offset {int(part[falls[0] + 1])} after {int(part[falls[0]])} (sentence "
                               f"{i}): offsets must never decrease")
    if last != n_ids:
        raise damaged_file(path, f"ends at offset {last} but its .bin holds {n_ids} ids")


def check_ids(flat, vocab_size, path, chunk=None):
    """Refuse a token array with an id outside ``0 .. vocab_size - 1``, checked ``chunk`` ids at a time."""
    chunk = chunk or VERIFY_CHUNK
    for start in range(0, flat.size, chunk):
        part = np.asarray(flat[start:start + chunk])
        low, high = int(part.min()), int(part.max())
        if low < 0 or high >= vocab_size:
            raise damaged_file(path, f"holds id {high if high >= vocab_size else low}, outside the vocabulary of "
                               f"{vocab_size}")


# A prepared folder is built in a locked temp folder beside it and renamed into place when whole.
def work_glob(out_dir):
    return glob.escape(f".{out_dir.name}.") + "*.tmp"


def new_work_folder(out_dir):
    """``(temp folder, descriptor holding its lock or None)``: a hidden folder beside ``out_dir``, locked (flock on
    the folder itself) for as long as this process lives, so that :func:`remove_stale_work` leaves it alone."""
    while True:
        work = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
        if fcntl is None:
            return work, None
        fd = os.open(work, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks only while a cleaner that took it first removes it
        try:
            if os.path.samestat(os.stat(work), os.fstat(fd)):
                return work, fd
        except FileNotFoundError:
            pass
        os.close(fd)  # a cleaner removed it between mkdtemp and flock: make another


def remove_stale_work(out_dir):
    """Remove the temp folders of preparations of ``out_dir`` that were killed (SIGKILL, a power cut): those whose
    lock nobody holds (the kernel drops a dead process's lock); a live preparation's is kept. Returns their paths."""
    out_dir = pathlib.Path(out_dir)
    if fcntl is None or not out_dir.parent.is_dir():
        return []
    removed = []
    for work in sorted(out_dir.parent.glob(work_glob(out_dir))):
        if work.is_symlink() or not work.is_dir():
            continue
        try:
            fd = os.open(work, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue  # gone meanwhile, or not ours to read
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: a preparation is running
            continue
        try:
            shutil.rmtree(work, ignore_errors=True)
            removed.append(work)
        finally:
            os.close(fd)
    return removed


def start_preparation(out_dir, reusable, what, log):
    """Before preparing ``out_dir``: remove the temp folders of killed preparations, then None if
    ``reusable()`` says the folder already holds this preparation, else ``(work, held)``: a new locked
    temp folder beside it (:func:`new_work_folder`). ``what`` names the folder in the log."""
    removed = remove_stale_work(out_dir)
    if removed:
        log(f"removed {len(removed)} temp folder(s) left by killed preparations of {out_dir}")
    if reusable():
        log(f"{what} {out_dir}: reused (its manifest matches the sources and settings)")
        return None
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return new_work_folder(out_dir)


def load_manifest(folder, what, prepare_first):
    """(path, parsed JSON) of ``folder``'s manifest.json, refused in one line when the folder or the file is
    missing (saying ``prepare_first``) or not JSON; its fields are the caller's to check."""
    folder = pathlib.Path(folder)
    path = inside_folder(folder, "manifest.json")
    if not path.is_file():
        missing = "does not exist" if not folder.exists() else "has no manifest.json"
        raise DataError(f"{what} {str(folder)!r} {missing}; prepare it first ({prepare_first})")
    try:
        return path, json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise damaged_file(path, f"is not valid JSON ({error})") from None


def move_into_place(work, out_dir):
    """Rename the finished folder to ``out_dir``, replacing an old one only after the new one is whole."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.rename(out_dir, old)
    os.rename(work, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


#: Linux's terminal line discipline keeps at most this many bytes of a typed line (N_TTY_BUF_SIZE - 1).
TERMINAL_LINE_LIMIT = 4095


def answer_each_line(answer, what, longer="a pipe", stdin=None, stdout=None, stderr=None, max_chars=MAX_CHARS):
    """A terminal session: read lines and write ``answer(text, number)`` as soon as each line ends
    (``number`` counts lines from 1). A line that is not UTF-8, or that ``answer`` refuses with a
    DataError, gives a one-line error on stderr and the session goes on; a line the terminal cut
    gives a warning naming ``longer`` (what to use instead). Ctrl-D or Ctrl-C ends it with status 0."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    print(f"Type {what} and press Enter; Ctrl-D ends.", file=stderr, flush=True)
    reader = getattr(stdin, "buffer", stdin)
    try:
        for number, raw in enumerate(iter(reader.readline, b""), start=1):
            if len(raw.rstrip(b"\r\n")) >= TERMINAL_LINE_LIMIT:  # the terminal dropped the rest of the line
                print(f"warning: a terminal passes at most {TERMINAL_LINE_LIMIT} bytes of a line, so this one was "
                      f"cut there; for longer lines use {longer}", file=stderr, flush=True)
            try:
                lines = decode_lines(raw, "that line", max_chars=max_chars)
                stdout.write(answer(lines[0] if lines else "", number) + "\n")
                stdout.flush()
            except DataError as error:
                print(f"error: {error}", file=stderr, flush=True)
    except KeyboardInterrupt:
        print(file=stderr)
    return 0
