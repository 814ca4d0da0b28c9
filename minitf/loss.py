"""Label-smoothed cross-entropy (paper 5.4, Szegedy et al. 2016).

The target distribution puts ``1 - eps`` on the right token and spreads ``eps``
uniformly over all V tokens:  q = (1 - eps) * onehot(y) + eps / V.
The loss is  -sum_v q_v log p_v, averaged over the non-pad target tokens.
"""
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
        if logits.dtype == xp.float16:                                # mixed precision: softmax and loss in float32
            logits = logits.astype(xp.float32)
        V, eps = logits.shape[-1], self.smoothing
        keep = (target != self.ignore_index).astype(logits.dtype)     # 1 for real tokens, 0 for pad  (B, T)
        num_tokens = keep.sum()                                       # 0-d
        safe_target = xp.where(target == self.ignore_index, 0, target)  # pads point at id 0  (B, T)
        # log p_v = z_v - max z - log sum exp(z - max z)   (stable log-softmax); with s = z - max z
        # only two things of log p are needed: log p_y = s_y - lse and mean_v log p_v = mean(s) - lse
        s = logits - logits.max(axis=-1, keepdims=True)               # s = z - max z (a fresh array)  (B, T, V)
        s_y = xp.take_along_axis(s, safe_target[..., None], axis=-1)[..., 0]   # (B, T, 1) -> (B, T)
        s_mean = s.mean(axis=-1)                                      # (B, T)
        p = xp.exp(s, out=s)                                          # exp in place: s is not needed again
        total = p.sum(axis=-1, keepdims=True)                         # (B, T, 1)
        lse = xp.log(total[..., 0])                                   # log sum exp(s)  (B, T)
        nll = lse - s_y                                               # -log p_y  (B, T)
        uniform = lse - s_mean                                        # -(1/V) sum_v log p_v  (B, T)
        per_token = (1.0 - eps) * nll + eps * uniform                 # -sum_v q_v log p_v  (B, T)
        denominator = xp.maximum(num_tokens, 1)                       # an all-pad batch gives 0, not NaN
        p /= total                                                    # p = softmax(z), kept for backward
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
        dlogits = saved.p                                             # p = softmax(z); reused in place  (B, T, V)
        dlogits -= eps / V                                            # p - eps/V ...
        rows = dlogits.reshape(-1, V)                                 # a view  (B*T, V)
        rows[xp.arange(rows.shape[0]), saved.safe_target.reshape(-1)] -= 1.0 - eps   # ... - (1-eps) at y
        dlogits *= (saved.keep * (dloss / saved.denominator))[..., None]  # pads get 0; mean over tokens
        return dlogits if dlogits.dtype == saved.out_dtype else dlogits.astype(saved.out_dtype)
