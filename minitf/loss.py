"""Label-smoothed cross-entropy (paper 5.4, Szegedy et al. 2016).

The target distribution puts ``1 - eps`` on the right token and spreads ``eps``
uniformly over all V tokens:  q = (1 - eps) * onehot(y) + eps / V.
The loss is  -sum_v q_v log p_v, averaged over the non-pad target tokens.
"""
import functools

from minitf import backend
from minitf.backend import xp
from minitf.module import Module


class LabelSmoothedCrossEntropy(Module):
    """``loss = loss_fn(logits, target)``: logits (B, T, V), target (B, T) ints.

    Returns a Python float; ``backward()`` returns dL/dlogits (B, T, V). Float16 logits
    (mixed precision) are cast to float32 for the log-softmax and the sums.
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
        target = backend.asarray(target)                              # host ids -> device, once  (B, T)
        out_dtype = logits.dtype                                      # dlogits come back in this dtype
        (B, T), V, eps = target.shape, logits.shape[-1], self.smoothing
        dtype = xp.float32 if logits.dtype == xp.float16 else logits.dtype   # float16 works in float32
        keep = (target != self.ignore_index).astype(dtype)            # 1 for real tokens, 0 for pad  (B, T)
        num_tokens = keep.sum()                                       # 0-d
        safe_target = xp.where(target == self.ignore_index, 0, target)  # pads point at id 0  (B, T)
        # the rows of softmax_terms below on blocks of rows on backend.threads() threads: the same numbers
        p, s_y, s_mean, total = backend.by_rows(self.softmax_terms, logits.reshape(-1, V), safe_target.reshape(-1))
        p, s_y, s_mean, total = p.reshape(B, T, V), s_y.reshape(B, T), s_mean.reshape(B, T), total.reshape(B, T, 1)
        lse = xp.log(total[..., 0])                                   # log sum exp(s)  (B, T)
        nll = lse - s_y                                               # -log p_y  (B, T)
        uniform = lse - s_mean                                        # -(1/V) sum_v log p_v  (B, T)
        per_token = (1.0 - eps) * nll + eps * uniform                 # -sum_v q_v log p_v  (B, T)
        denominator = xp.maximum(num_tokens, 1)                       # an all-pad batch gives 0, not NaN
        self.save_for_backward(p=p, safe_target=safe_target, keep=keep, denominator=denominator,
                               out_dtype=out_dtype)
        # the three logged numbers come to the host in one copy (one device sync per call)
        stats = xp.stack([(per_token * keep).sum() / denominator, (nll * keep).sum(), num_tokens])  # (3,)
        loss, self.nll_sum, self.num_tokens = backend.to_numpy(stats).tolist()
        return loss

    def backward(self, dloss=1.0):
        """-> dL/dlogits (B, T, V) = dloss * (softmax(z) - q) * keep / N, in the logits' dtype.

        Float16 logits are handled in float32 and only the result is cast back, so a loss
        scale given as ``dloss`` is applied before the rounding to float16."""
        saved = self.saved_tensors()
        V, eps = saved.p.shape[-1], self.smoothing
        weight = (saved.keep * (dloss / saved.denominator)).reshape(-1)   # pads get 0; mean over tokens  (B*T,)
        # the rows of dlogits_rows below on blocks of rows on backend.threads() threads, in place in p
        rows = functools.partial(LabelSmoothedCrossEntropy.dlogits_rows, eps=eps, out_dtype=saved.out_dtype)
        cast = backend.by_rows(rows, saved.p.reshape(-1, V), saved.safe_target.reshape(-1), weight)
        return saved.p if cast is None else cast.reshape(saved.p.shape)

    @staticmethod
    def softmax_terms(logits, safe_target):
        """What the loss needs of the log-softmax of rows of logits (N, V) with targets (N,): ``p = softmax(z)`` (a
        fresh array), ``s_y``, ``mean(s)`` (N,) and ``sum exp(s)`` (N, 1), s = z - max z. Float16 logits (mixed
        precision) are cast to float32 first."""
        if logits.dtype == xp.float16:                                # mixed precision: softmax and loss in float32
            logits = logits.astype(xp.float32)
        # log p_v = z_v - max z - log sum exp(z - max z)   (stable log-softmax); with s = z - max z
        # only two things of log p are needed: log p_y = s_y - lse and mean_v log p_v = mean(s) - lse
        s = logits - logits.max(axis=-1, keepdims=True)               # s = z - max z (a fresh array)  (N, V)
        s_y = xp.take_along_axis(s, safe_target[..., None], axis=-1)[..., 0]   # (N, 1) -> (N,)
        s_mean = s.mean(axis=-1)                                      # (N,)
        p = xp.exp(s, out=s)                                          # exp in place: s is not needed again
        total = p.sum(axis=-1, keepdims=True)                         # (N, 1)
        p /= total                                                    # p = softmax(z), kept for backward
        return p, s_y, s_mean, total

    @staticmethod
    def dlogits_rows(p, safe_target, weight, eps, out_dtype):
        """dL/dlogits of rows: p (N, V) = softmax(z) becomes ``(p - q) * weight`` in place (weight (N,): keep / N
        times dloss); returns None, or the result cast to ``out_dtype`` where that is not p's dtype."""
        V = p.shape[-1]
        dlogits = p                                                   # p = softmax(z); reused in place  (N, V)
        dlogits -= eps / V                                            # p - eps/V ...
        dlogits[xp.arange(dlogits.shape[0]), safe_target] -= 1.0 - eps   # ... - (1-eps) at y
        dlogits *= weight[:, None]                                    # pads get 0; mean over tokens
        if dlogits.dtype != out_dtype:                                # float16 logits: the result rounded once
            return dlogits.astype(out_dtype)
        return None
