"""The metrics log of a run (``metrics.jsonl``) and perplexity."""
import json
import math
import pathlib

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

    def write(self, **record):
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")

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
            write_atomic(self.path, b"".join(line + b"\n" for line in kept))
        return len(lines) - len(kept)
