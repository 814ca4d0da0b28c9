"""The time budget of a run (``--max-minutes``): wall time of the whole command,
from its start (corpus, tokenizer, training, validations, checkpoints) to its
last line (averaging, the final choice on validation, test BLEU, examples).

Training stops early enough to leave time for the end: the end's cost is
estimated from the measured duration of the periodic validations (the end
decodes the validation set twice, once per candidate model, and the test set
with beam search), so a slower machine stops training sooner instead of
overrunning. The progress bar's ETA is the time left to the end of the command.
"""
import time

#: The clock; a test replaces it with a fake one.
clock = time.monotonic
#: Beam search costs about this many times a greedy decode of the same sentences.
BEAM_FACTOR = 2.0
#: Seconds added to the estimate for saving, averaging and the examples.
MARGIN_SECONDS = 10.0
#: Before any validation was timed: reserve this share of the budget for the end.
UNMEASURED_SHARE = 0.08

_command_start = None


def mark_command_start():
    """Called first thing by ``train.py``: the budget counts from here."""
    global _command_start
    _command_start = clock()


class WallBudget:
    """Wall seconds spent by a run and what is left of ``max_minutes``.

    Parameters
    ----------
    max_minutes : float or None
        None: no time budget (only steps or epochs end the run).
    """

    def __init__(self, max_minutes):
        self.limit = None if max_minutes is None else 60.0 * float(max_minutes)
        self.started = clock() if _command_start is None else _command_start
        self.before = 0.0  # wall seconds of earlier invocations of a resumed run
        self.seconds_per_sentence = None  # of a periodic validation (loss + greedy BLEU), per sentence
        self.validation_seconds = 0.0

    @staticmethod
    def now():
        """The budget's clock (seconds, arbitrary origin)."""
        return clock()

    def elapsed(self):
        """Wall seconds of the run so far (earlier invocations included)."""
        return self.before + clock() - self.started

    def note_validation(self, seconds, sentences):
        """Record a periodic validation's duration; the end's estimate follows it."""
        self.validation_seconds = float(seconds)
        self.seconds_per_sentence = float(seconds) / max(int(sentences), 1)

    def end_reserve(self, n_valid, n_test, beam, candidates=2):
        """Seconds to keep for what follows training: one more periodic validation
        (it may start right before the stop), ``candidates`` greedy decodes of the
        ``n_valid`` sentences the final choice uses, the test set with ``beam``,
        and a margin."""
        if self.limit is None:
            return 0.0
        if self.seconds_per_sentence is None:
            return UNMEASURED_SHARE * self.limit + MARGIN_SECONDS
        per = self.seconds_per_sentence
        test = per * n_test * (BEAM_FACTOR if beam > 1 else 1.0)
        return self.validation_seconds + candidates * per * n_valid + test + MARGIN_SECONDS

    def over(self, reserve):
        """True once training must stop to end the command within the budget."""
        return self.limit is not None and self.elapsed() + reserve >= self.limit

    def eta(self):
        """' ETA m:ss' to the end of the command ('' without a time budget)."""
        if self.limit is None:
            return ""
        left = max(0, int(self.limit - self.elapsed()))
        return f" ETA {left // 60}:{left % 60:02d}"
