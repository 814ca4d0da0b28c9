"""Exercise: the masked-language-model loss, BERT's pre-training objective (docs/bert.md),

    loss = (1 / M) sum over the M masked positions of -log softmax(logits)[label],

where ``labels`` holds the original token at each masked position and -100 (``ignore_index``)
at every other one: only the masked positions carry loss. Write ``backward``: return
dL/dlogits (times ``dloss``), of the shape of logits. Check it:

    python -m minitf.exercise check masked_lm_loss.py
"""
from minitf.backend import xp
from minitf.module import Module

EXERCISE = "masked_lm_loss"


class MaskedLMLoss(Module):
    """logits (B, T, V), labels (B, T) ints (-100: not masked) -> a float, the mean over masked positions."""

    def __init__(self, ignore_index=-100):
        self.ignore_index = ignore_index

    def forward(self, logits, labels):
        masked = labels != self.ignore_index                            # True where a token was masked  (B, T)
        safe_labels = xp.where(masked, labels, 0)                       # the others point at id 0  (B, T)
        s = logits - logits.max(axis=-1, keepdims=True)
        log_p = s - xp.log(xp.exp(s).sum(axis=-1, keepdims=True))      # log softmax  (B, T, V)
        nll = -xp.take_along_axis(log_p, safe_labels[..., None], axis=-1)[..., 0]  # -log p[label]  (B, T)
        count = max(int(masked.sum()), 1)                               # M, the masked positions
        self.save_for_backward(p=xp.exp(log_p), safe_labels=safe_labels, masked=masked, count=count)
        return float((nll * masked).sum() / count)

    def backward(self, dloss=1.0):
        """-> dL/dlogits (B, T, V)."""
        saved = self.saved_tensors()   # saved.p, saved.safe_labels, saved.masked, saved.count
        # your code: d(-log p[label])/dlogits at one masked position, then the mean over the M of them
        raise NotImplementedError("MaskedLMLoss.backward is not written yet")
