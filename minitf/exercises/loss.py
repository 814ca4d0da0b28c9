"""Exercise: label-smoothed cross-entropy (docs/layers/loss.md),

    q = (1 - eps) onehot(target) + eps / V,   loss = mean over non-pad tokens of -sum_v q_v log p_v,

with p = softmax(logits). Write ``backward``: return dL/dlogits (times ``dloss``). Check it:

    python -m minitf.exercise check loss.py
"""
from minitf.backend import xp
from minitf.module import Module

EXERCISE = "loss"


class LabelSmoothedCrossEntropy(Module):
    """logits (B, T, V), target (B, T) ints -> a float; pad tokens (``ignore_index``) count for nothing."""

    def __init__(self, smoothing=0.1, ignore_index=0):
        self.smoothing, self.ignore_index = smoothing, ignore_index

    def forward(self, logits, target):
        V, eps = logits.shape[-1], self.smoothing
        keep = (target != self.ignore_index).astype(logits.dtype)      # 1 for real tokens  (B, T)
        safe_target = xp.where(target == self.ignore_index, 0, target)  # pads point at id 0  (B, T)
        s = logits - logits.max(axis=-1, keepdims=True)
        log_p = s - xp.log(xp.exp(s).sum(axis=-1, keepdims=True))      # log softmax  (B, T, V)
        q = xp.full(logits.shape, eps / V)
        xp.put_along_axis(q, safe_target[..., None], 1.0 - eps + eps / V, axis=-1)
        per_token = -(q * log_p).sum(axis=-1)                           # (B, T)
        denominator = xp.maximum(keep.sum(), 1)                         # N, the non-pad tokens
        self.save_for_backward(p=xp.exp(log_p), safe_target=safe_target, keep=keep,
                               denominator=denominator, out_dtype=logits.dtype)
        return float((per_token * keep).sum() / denominator)

    def backward(self, dloss=1.0):
        """-> dL/dlogits (B, T, V)."""
        saved = self.saved_tensors()   # saved.p, saved.safe_target, saved.keep, saved.denominator
        # your code: d(-sum_v q_v log p_v)/dlogits for one token, then the mean over real tokens
        raise NotImplementedError("LabelSmoothedCrossEntropy.backward is not written yet")
