"""Exercise: T5's relative position bias, one table per stack, shared by every layer of it (docs/t5.md).

``scores`` (2, N, B, H, T, T) holds the attention scores of N layers of the encoder (``scores[0]``) and N of the
decoder (``scores[1]``). ``forward`` adds the encoder's table's bias (bidirectional buckets) to every encoder
layer's scores and the decoder's table's (the past only) to every decoder layer's:
``bias[h, i, j] = W[bucket(j - i), h]``.

Write ``backward``: return dL/dscores and add dL/dW into ``self.encoder.grad`` and ``self.decoder.grad``. Many
query-key pairs share a bucket; every sentence and every layer of a stack adds the same bias; each stack has its
own table. Check it:

    python -m minitf.exercise check relative_bias.py
"""
from minitf import backend
from minitf.attention import relative_position_bucket
from minitf.backend import xp
from minitf.module import Module, Parameter

EXERCISE = "relative_bias"


class SharedBias(Module):
    """encoder, decoder (num_buckets, H); scores (2, N, B, H, T, T) -> scores + each stack's bias."""

    def __init__(self, num_heads, num_buckets=8, max_distance=6):
        self.encoder = Parameter(xp.zeros((num_buckets, num_heads)))
        self.decoder = Parameter(xp.zeros((num_buckets, num_heads)))
        self.num_buckets, self.max_distance = num_buckets, max_distance

    def buckets(self, length, bidirectional):
        """(T, T) device ints: the bucket of query i (a row) and key j (a column)."""
        np = backend.host
        relative = np.arange(length)[None, :] - np.arange(length)[:, None]  # j - i  (T, T)
        return backend.asarray(relative_position_bucket(relative, bidirectional, self.num_buckets, self.max_distance))

    def forward(self, scores):
        T = scores.shape[-1]
        enc, dec = self.buckets(T, True), self.buckets(T, False)
        self.save_for_backward(enc, dec)
        bias = xp.stack([self.encoder.data[enc], self.decoder.data[dec]])  # (2, T, T, H)
        return scores + bias.transpose(0, 3, 1, 2)[:, None, None]          # (2, 1, 1, H, T, T): every layer, sentence

    def backward(self, dy):
        """dy (2, N, B, H, T, T) -> dscores (the same shape); adds the gradients of both tables."""
        enc, dec = self.saved_tensors()
        # your code: which table entry did each (stack, layer, sentence, head, query, key) read?
        raise NotImplementedError("SharedBias.backward is not written yet")
