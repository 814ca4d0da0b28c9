"""The metrics log of a run (``metrics.jsonl``) and perplexity."""
import errno
import json
import math
import os
import pathlib

from minitf.nmt.errors import MetricsWriteError
from minitf.nmt.files import write_atomic

#: exp() of a per-token NLL above this overflows into meaningless numbers early in training
_MAX_LOG_PERPLEXITY = 50.0


def perplexity(nll_per_token):
    """exp(mean negative log-likelihood per token), clamped at exp(50)."""
    return math.exp(min(nll_per_token, _MAX_LOG_PERPLEXITY))


class MetricsLog:
    """One JSON object per line: {"kind": "train" | "valid" | "test" | ..., "step": ..., ...}."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.unwritten = []  # records a failed write kept (saved in the next checkpoint's meta.json)

    def write(self, **record):
        """Append one record. If the disk refuses (ENOSPC, EIO), the file is cut back to
        what it held (no torn line), the record is kept in ``unwritten`` and
        MetricsWriteError is raised."""
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        try:
            with open(self.path, "ab", buffering=0) as handle:
                size = handle.tell()
                try:
                    if handle.write(line) != len(line):
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                except OSError:
                    try:
                        handle.truncate(size)
                    except OSError:
                        pass
                    raise
        except OSError as error:
            self.unwritten.append(record)
            raise MetricsWriteError(self.path, error.strerror or str(error)) from None

    def append_unwritten(self, records):
        """Append the records a run could not write before its checkpoint was saved
        (``unwritten_metrics`` in meta.json), so that the log is whole again."""
        for record in records if isinstance(records, list) else []:
            if isinstance(record, dict):
                self.write(**record)

    def truncate(self, step):
        """Keep the records a run had written when it saved its checkpoint at ``step``
        (the longest prefix with step <= ``step`` and no end-of-run report), atomically.
        A resumed run then appends exactly what an uninterrupted run would have.
        Returns the number of records dropped (a torn last line counts as one)."""
        if not self.path.is_file():
            return 0
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        kept = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:  # a line torn by a kill
                break
            if not isinstance(record, dict) or record.get("kind") == "done" or not record.get("step", 0) <= step:
                break
            kept.append(line)
        if len(kept) < len(lines) or (data and not data.endswith(b"\n")):
            try:
                write_atomic(self.path, b"".join(line + b"\n" for line in kept))
            except OSError as error:  # write_atomic left the file as it was and no temp file
                raise MetricsWriteError(self.path, error.strerror or str(error),
                                        "nothing was changed; free disk space and try again") from None
        return len(lines) - len(kept)
