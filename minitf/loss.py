"""Label-smoothed cross-entropy (paper 5.4, Szegedy et al. 2016).

The target distribution puts ``1 - eps`` on the right token and spreads ``eps``
uniformly over all V tokens:  q = (1 - eps) * onehot(y) + eps / V.
The loss is  -sum_v q_v log p_v, averaged over the non-pad target tokens.
"""
from minitf.backend import xp
from minitf.module import Module


class LabelSmoothedCrossEntropy(Module):
    """``loss = loss_fn(logits, target)``: logits (B, T, V), target (B, T) ints.

    Returns a Python float; ``backward()`` returns dL/dlogits (B, T, V).
    After a call, ``num_tokens`` and ``nll_sum`` (the unsmoothed negative
    log-likelihood, for perplexity) describe the batch.
    """

    def __init__(self, smoothing=0.1, ignore_index=0):
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing, self.ignore_index = smoothing, ignore_index

    def forward(self, logits, target):
        if logits.ndim != 3 or target.shape != logits.shape[:2]:
            raise ValueError(f"expected logits (B, T, V) and target (B, T), got {tuple(logits.shape)} "
                             f"and {tuple(target.shape)}")
        target = xp.asarray(target)
        V, eps = logits.shape[-1], self.smoothing
        # log p = z - max z - log sum exp(z - max z)   (stable log-softmax)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_p = shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))
        keep = (target != self.ignore_index).astype(logits.dtype)     # 1 for real tokens, 0 for pad
        num_tokens = keep.sum()
        safe_target = xp.where(target == self.ignore_index, 0, target)
        nll = -xp.take_along_axis(log_p, safe_target[..., None], axis=-1)[..., 0]   # -log p_y
        uniform = -log_p.mean(axis=-1)                                # -(1/V) sum_v log p_v
        per_token = (1.0 - eps) * nll + eps * uniform                 # -sum_v q_v log p_v
        denominator = xp.maximum(num_tokens, 1)                       # an all-pad batch gives 0, not NaN
        self.save_for_backward(log_p, safe_target, keep, denominator)
        loss, self.nll_sum, self.num_tokens = (
            float(v) for v in ((per_token * keep).sum() / denominator, (nll * keep).sum(), num_tokens))
        return loss

    def backward(self, dloss=1.0):
        """-> dL/dlogits (B, T, V) = (softmax(z) - q) * keep / N."""
        log_p, safe_target, keep, denominator = self.saved_tensors()
        V, eps = log_p.shape[-1], self.smoothing
        dlogits = xp.exp(log_p)                                       # p = softmax(z)
        dlogits -= eps / V                                            # p - eps/V ...
        rows = dlogits.reshape(-1, V)
        rows[xp.arange(rows.shape[0]), safe_target.reshape(-1)] -= 1.0 - eps   # ... - (1-eps) at y
        dlogits *= (keep * (dloss / denominator))[..., None]         # pads get 0; mean over tokens
        return dlogits
