"""The Transformer of "Attention Is All You Need": feed-forward, residual blocks,
encoder and decoder layers and stacks, and the whole encoder-decoder model.

Shapes: B batch, S source length, T target length, L either, D d_model, H heads,
F d_ff, V vocabulary size.
"""
import dataclasses

from minitf import backend
from minitf.attention import MultiHeadAttention
from minitf.layers import (ACTIVATIONS, POSITION_LAYOUTS, Dropout, Embedding, LayerNorm, Linear, OutputProjection,
                           PositionalEncoding, make_activation)
from minitf.module import Module, ModuleList


# --------------------------------------------------------------------------- #
# FFN(x) = max(0, x W1 + b1) W2 + b2                                 (paper eq. 2)
# --------------------------------------------------------------------------- #
class FeedForward(Module):
    """Position-wise feed-forward network: (..., D) -> (..., F) -> (..., D).

    ``activation``: "relu" (the paper), "gelu" (exact), "gelu_tanh" (GPT-2's) or "silu" (Marian's)."""

    def __init__(self, d_model, d_ff, activation="relu"):
        self.linear1 = Linear(d_model, d_ff)
        self.activation = make_activation(activation)
        self.linear2 = Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(self.activation(self.linear1(x)))

    def backward(self, dy):
        return self.linear1.backward(self.activation.backward(self.linear2.backward(dy)))


# --------------------------------------------------------------------------- #
# Residual connection around a sublayer                         (paper 3.1, 5.4)
#   post-LN (the paper):  y = LayerNorm(x + Dropout(Sublayer(x)))
#   pre-LN (option):      y = x + Dropout(Sublayer(LayerNorm(x)))
# --------------------------------------------------------------------------- #
class SublayerConnection(Module):
    """The residual connection, LayerNorm and dropout around one sublayer.

    ``block(x, sublayer)`` runs ``sublayer`` (a function (B, L, D) -> (B, L, D), e.g.
    ``lambda h: self.self_attn(h, key_padding_mask=mask)``) inside the block, and
    ``block.backward(dy, sublayer_backward)`` mirrors it with the sublayer's backward.
    """

    def __init__(self, d_model, dropout, pre_norm=False, layer_norm_eps=1e-5):
        self.norm = LayerNorm(d_model, layer_norm_eps)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x, sublayer):
        """x (B, L, D) -> y (B, L, D)."""
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))

    def backward(self, dy, sublayer_backward):
        """dy (B, L, D) -> dx (B, L, D).

        ``sublayer_backward`` maps dL/d(sublayer output) to dL/d(sublayer input). A
        sublayer with a second input (cross-attention's memory) returns the pair
        (dL/d(input), dL/d(memory)); the block then returns (dx, dmemory)."""
        if self.pre_norm:
            # y = x + Dropout(s)  =>  dx_skip = dy,  ds = Dropout'(dy)
            dx_skip = dy
        else:
            # y = LayerNorm(z), z = x + Dropout(s)  =>  dz = LayerNorm'(dy); dx_skip = dz, ds = Dropout'(dz)
            dx_skip = self.norm.backward(dy)
        dsublayer = self.dropout.backward(dx_skip)
        dsublayer_input = sublayer_backward(dsublayer)
        is_pair = isinstance(dsublayer_input, tuple)          # attention returns (dh, dmemory)
        dh, dmemory = dsublayer_input if is_pair else (dsublayer_input, None)
        # x feeds both the skip path and the sublayer (through LayerNorm when pre-LN): gradients add
        dx = dx_skip + (self.norm.backward(dh) if self.pre_norm else dh)
        return (dx, dmemory) if is_pair else dx


class EncoderLayer(Module):
    """Self-attention then feed-forward, each in a residual block. x (B, S, D) -> (B, S, D).
    ``activation``: the feed-forward's (:class:`FeedForward`); ``attention_dropout``: on the attention weights (the
    paper's 0: none; BERT's ``attention_probs_dropout_prob``)."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, pre_norm=False, activation="relu", layer_norm_eps=1e-5,
                 attention_dropout=0.0):
        self.self_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.attn_block = SublayerConnection(d_model, dropout, pre_norm, layer_norm_eps)
        self.feed_forward = FeedForward(d_model, d_ff, activation)
        self.ff_block = SublayerConnection(d_model, dropout, pre_norm, layer_norm_eps)

    def forward(self, x, key_padding_mask=None):
        x = self.attn_block(x, lambda h: self.self_attn(h, key_padding_mask=key_padding_mask))
        return self.ff_block(x, self.feed_forward)

    def backward(self, dy):
        dx = self.ff_block.backward(dy, self.feed_forward.backward)
        dx, _ = self.attn_block.backward(dx, self.self_attn.backward)  # self-attention: no memory
        return dx


class DecoderLayer(Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward.

    x (B, T, D), memory (B, S, D) -> (B, T, D). Backward returns (dx, dmemory).
    With ``cross_attention=False`` (a GPT's block: no encoder to attend to) the layer is masked
    self-attention and feed-forward only; ``memory`` is None and dmemory is 0. ``attention_dropout``: on both
    attentions' weights (the paper's 0: none; GPT-2's ``attn_pdrop``).
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, pre_norm=False, activation="relu",
                 cross_attention=True, layer_norm_eps=1e-5, attention_dropout=0.0):
        self.self_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.self_attn_block = SublayerConnection(d_model, dropout, pre_norm, layer_norm_eps)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, attention_dropout) if cross_attention else None
        self.cross_attn_block = (SublayerConnection(d_model, dropout, pre_norm, layer_norm_eps) if cross_attention
                                 else None)
        self.feed_forward = FeedForward(d_model, d_ff, activation)
        self.ff_block = SublayerConnection(d_model, dropout, pre_norm, layer_norm_eps)

    def forward(self, x, memory=None, memory_padding_mask=None, tgt_padding_mask=None, cache=None):
        self_cache = None if cache is None else cache.setdefault("self", {})
        x = self.self_attn_block(x, lambda h: self.self_attn(
            h, key_padding_mask=tgt_padding_mask, causal=True, cache=self_cache))
        if self.cross_attn is not None:
            cross_cache = None if cache is None else cache.setdefault("cross", {})
            x = self.cross_attn_block(x, lambda h: self.cross_attn(
                h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache))
        return self.ff_block(x, self.feed_forward)

    def backward(self, dy):
        dx = self.ff_block.backward(dy, self.feed_forward.backward)
        dmemory = 0  # no cross-attention: the memory (there is none) gets nothing
        if self.cross_attn is not None:
            dx, dmemory = self.cross_attn_block.backward(dx, self.cross_attn.backward)
        dx, _ = self.self_attn_block.backward(dx, self.self_attn.backward)
        return dx, dmemory


class Encoder(Module):
    """N encoder layers (and a final LayerNorm when pre-LN). x (B, S, D) -> memory (B, S, D)."""

    def __init__(self, num_layers, d_model, num_heads, d_ff, dropout=0.1, pre_norm=False, activation="relu",
                 layer_norm_eps=1e-5, attention_dropout=0.0):
        self.layers = ModuleList([EncoderLayer(d_model, num_heads, d_ff, dropout, pre_norm, activation, layer_norm_eps,
                                               attention_dropout)
                                  for _ in range(num_layers)])
        self.final_norm = LayerNorm(d_model, layer_norm_eps) if pre_norm else None

    def forward(self, x, key_padding_mask=None):
        for layer in self.layers:
            x = layer(x, key_padding_mask)
        return self.final_norm(x) if self.final_norm is not None else x

    def backward(self, dy):
        """dy (B, S, D) -> dx (B, S, D)."""
        dx = self.final_norm.backward(dy) if self.final_norm is not None else dy
        for layer in reversed(list(self.layers)):
            dx = layer.backward(dx)  # one layer's input gradient is the output gradient of the layer below
        return dx


class Decoder(Module):
    """N decoder layers (and a final LayerNorm when pre-LN). x (B, T, D) -> (B, T, D).

    Every layer reads the same encoder output, so backward sums their
    contributions into one dmemory (B, S, D). ``activation`` and ``cross_attention`` as in
    :class:`DecoderLayer` (without cross-attention: a GPT's stack, no memory, dmemory 0)."""

    def __init__(self, num_layers, d_model, num_heads, d_ff, dropout=0.1, pre_norm=False, activation="relu",
                 cross_attention=True, layer_norm_eps=1e-5, attention_dropout=0.0):
        self.layers = ModuleList([DecoderLayer(d_model, num_heads, d_ff, dropout, pre_norm, activation,
                                               cross_attention, layer_norm_eps, attention_dropout)
                                  for _ in range(num_layers)])
        self.final_norm = LayerNorm(d_model, layer_norm_eps) if pre_norm else None

    def forward(self, x, memory=None, memory_padding_mask=None, tgt_padding_mask=None, cache=None):
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, memory_padding_mask, tgt_padding_mask,
                      cache=None if cache is None else cache.setdefault(i, {}))
        return self.final_norm(x) if self.final_norm is not None else x

    def backward(self, dy):
        """dy (B, T, D) -> (dx (B, T, D), dmemory (B, S, D))."""
        dx = self.final_norm.backward(dy) if self.final_norm is not None else dy
        dmemory = 0
        for layer in reversed(list(self.layers)):
            dx, dmemory_layer = layer.backward(dx)
            dmemory = dmemory + dmemory_layer  # memory feeds every layer: gradients add
        return dx, dmemory


def check_ids(ids, name, vocab_size):
    """Validate token ids at a model's boundary (a ValueError naming ``name`` when they
    are not a non-empty (B, L) integer array with ids in [0, vocab_size)); returns them
    as a device array. Ids on the host are range-checked there, with no device sync."""
    if not (backend.is_array(ids) or isinstance(ids, backend.host.ndarray)):
        raise ValueError(f"{name} must be an integer array of shape (B, L), got {type(ids).__name__}")
    if ids.ndim != 2:
        raise ValueError(f"{name} must have shape (B, L) (rank 2), got shape {tuple(ids.shape)}")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if 0 in ids.shape:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(ids.shape)}")
    if isinstance(ids, backend.host.ndarray):  # checked on the host: no device sync
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} must hold ids in [0, {vocab_size}), got values from {low} to {high}")
    return backend.asarray(ids)


# --------------------------------------------------------------------------- #
# The whole model (paper section 3, figure 1)
# --------------------------------------------------------------------------- #
def check_positive_ints(config, names):
    """Each of ``names`` of a model config a positive integer (not a bool); a ValueError naming the first that is
    not. Shared by TransformerConfig, GPTConfig and LlamaConfig."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_sizes(config, names):
    """A model config's sizes: each of ``names`` a positive integer, and d_model a multiple of num_heads (the
    heads split it); a ValueError naming the first that is not. Shared by TransformerConfig and GPTConfig."""
    check_positive_ints(config, names)
    if config.d_model % config.num_heads != 0:
        raise ValueError(f"d_model must be divisible by num_heads, got d_model={config.d_model}, "
                         f"num_heads={config.num_heads}")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """The model's shape and options, declared and checked once (here): ``Transformer(V, V, **options)``
    builds one and every layer from it, ``model.config`` is it (frozen: ``dataclasses.replace`` makes a
    changed copy). Defaults: the paper's base model (Table 3). A ValueError names a value that does not fit."""
    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    share_embeddings: bool = True
    pad_id: int = 0
    pre_norm: bool = False
    # what pretrained models (Marian, minitf/nmt/marian.py) change; the defaults are the paper's
    activation: str = "relu"
    positions: str = "interleaved"
    scale_embedding: bool = True
    output_bias: bool = False
    layer_norm_eps: float = 1e-5
    mask_target_padding: bool = True
    freeze_pad_embedding: bool = False
    tie_target_output: bool = False
    decoder_start_id: int | None = None
    eos_id: int | None = None

    def __post_init__(self):
        check_sizes(self, ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff", "num_encoder_layers",
                           "num_decoder_layers"))
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings=True needs one shared vocabulary, got "
                             f"src_vocab_size={self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}; "
                             "pass share_embeddings=False for separate vocabularies")
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(f"pad_id must be a valid token id below the vocabulary size, got {self.pad_id}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.positions not in POSITION_LAYOUTS:
            raise ValueError(f"positions must be one of {', '.join(POSITION_LAYOUTS)}, got {self.positions!r}")
        eps = self.layer_norm_eps
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and 0 < eps < 1):
            raise ValueError(f"layer_norm_eps must be a number in (0, 1), got {eps!r}")
        for name in ("decoder_start_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                          and 0 <= value < self.tgt_vocab_size):
                raise ValueError(f"{name} must be None or a token id below tgt_vocab_size {self.tgt_vocab_size}, "
                                 f"got {value!r}")
        # one type per switch (1 and True, 1 and 1.0 are the same model): frozen, so set through object
        for name in ("scale_embedding", "output_bias", "mask_target_padding", "freeze_pad_embedding",
                     "tie_target_output"):
            object.__setattr__(self, name, bool(getattr(self, name)))
        object.__setattr__(self, "layer_norm_eps", float(eps))


class Transformer(Module):
    """Encoder-decoder Transformer.

    ``model(src_ids, tgt_in_ids)`` takes integer arrays (B, S) and (B, T) and
    returns logits (B, T, V); padding masks come from ``pad_id``. With
    ``share_embeddings`` (paper 3.4) the source embedding, target embedding and
    pre-softmax projection are one (V, D) matrix, which needs one shared vocabulary.

    ``Transformer(src_vocab_size, tgt_vocab_size, **options)``: ``options`` are any fields of
    :class:`TransformerConfig` (``d_model=128, num_heads=4, ...``), where their defaults and checks are
    declared, once; the model keeps that frozen value as ``model.config`` and builds every layer from it
    (``Transformer.from_config(config)`` takes one whole).

    Options whose defaults are the paper's model, each one of Marian's (opus-mt's) differences
    (``minitf.nmt.marian.from_pretrained`` sets them from a Marian folder):

        option               the paper              Marian
        activation           "relu"                 "silu" (its "swish")
        positions            "interleaved"          "halves": [sin | cos] (layers.sinusoidal_table)
        output_bias          False                  True: logits = h W^T + b (final_logits_bias)
        mask_target_padding  True: target pads are  False: causal mask only (its decoder starts
                             masked keys            from pad, which must stay visible)
        freeze_pad_embedding False                  True: the pad row gets no gradient from its
                                                    lookups (PyTorch's padding_idx)
        decoder_start_id     None: the tokenizer's  pad_id
                             BOS (minitf's runs)
        eos_id               None: the tokenizer's  0

    ``scale_embedding`` (x sqrt(D), paper 3.4) and ``layer_norm_eps`` (1e-5) are Marian's too;
    ``tie_target_output`` ties the output projection to the target embedding when the vocabularies
    are separate (``share_embeddings=False``; Marian's separate-vocabulary models). The decoding
    functions read ``decoder_start_id`` and ``eos_id`` from ``model.config``; the model itself
    never looks at them.
    """

    def __init__(self, src_vocab_size, tgt_vocab_size, **options):
        self.config = c = TransformerConfig(src_vocab_size, tgt_vocab_size, **options)  # checked there
        self.d_model, self.pad_id, self.mask_target_padding = c.d_model, c.pad_id, c.mask_target_padding
        pad_row = c.pad_id if c.freeze_pad_embedding else None  # the row its lookups leave without gradient
        self.src_embed = Embedding(c.src_vocab_size, c.d_model, c.scale_embedding, pad_row)
        self.tgt_embed = (self.src_embed if c.share_embeddings
                          else Embedding(c.tgt_vocab_size, c.d_model, c.scale_embedding, pad_row))
        self.positional = PositionalEncoding(c.d_model, c.positions)
        self.src_dropout = Dropout(c.dropout)
        self.tgt_dropout = Dropout(c.dropout)
        layer = (c.d_model, c.num_heads, c.d_ff, c.dropout, c.pre_norm, c.activation)  # every layer's shape
        self.encoder = Encoder(c.num_encoder_layers, *layer, layer_norm_eps=c.layer_norm_eps)
        self.decoder = Decoder(c.num_decoder_layers, *layer, layer_norm_eps=c.layer_norm_eps)
        # tied: the embedding's own weight; untied: a weight of its own, initialised as an embedding's
        tied = c.share_embeddings or c.tie_target_output
        self.generator = OutputProjection(
            self.tgt_embed.weight if tied else Embedding(c.tgt_vocab_size, c.d_model).weight, bias=c.output_bias)

    @classmethod
    def from_config(cls, config):
        """Build the model a :class:`TransformerConfig` describes."""
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"Transformer.from_config takes a TransformerConfig, got {type(config).__name__}; "
                             "give the options as keywords instead: Transformer(V, V, d_model=...)")
        return cls(**dataclasses.asdict(config))

    # -- forward / backward ---------------------------------------------------------
    def encode(self, src_ids, src_padding_mask=None):
        """src_ids (B, S) -> memory (B, S, D) and the source padding mask (B, S), given or else the pad ids."""
        src_padding_mask = src_ids == self.pad_id if src_padding_mask is None else src_padding_mask  # decoding: lengths
        x = self.src_dropout(self.positional(self.src_embed(src_ids)))  # Dropout(Embed * sqrt(D) + PE)
        return self.encoder(x, src_padding_mask), src_padding_mask

    def decode(self, tgt_ids, memory, src_padding_mask, cache=None, start=0):
        """tgt_ids (B, T) -> logits (B, T, V). With ``cache`` (a dict, no_grad only),
        ``tgt_ids`` holds only the new positions, starting at position ``start``."""
        tgt_padding_mask = tgt_ids == self.pad_id
        if not self.mask_target_padding:  # Marian's decoder starts from pad: the causal mask only
            tgt_padding_mask = None
        y = self.tgt_dropout(self.positional(self.tgt_embed(tgt_ids), start=start))
        h = self.decoder(y, memory, src_padding_mask, None if cache is not None else tgt_padding_mask, cache)
        return self.generator(h)

    def forward(self, src_ids, tgt_in_ids):
        """src_ids (B, S), tgt_in_ids (B, T) integer arrays -> logits (B, T, V)."""
        src_ids = check_ids(src_ids, "src_ids", self.config.src_vocab_size)
        tgt_in_ids = check_ids(tgt_in_ids, "tgt_in_ids", self.config.tgt_vocab_size)
        if src_ids.shape[0] != tgt_in_ids.shape[0]:
            raise ValueError(f"src_ids and tgt_in_ids must have the same batch size, "
                             f"got {src_ids.shape[0]} and {tgt_in_ids.shape[0]}")
        memory, src_padding_mask = self.encode(src_ids)
        return self.decode(tgt_in_ids, memory, src_padding_mask)

    def backward(self, dlogits):
        """dlogits (B, T, V) -> fills ``p.grad`` of every parameter (accumulating)."""
        dh = self.generator.backward(dlogits)                 # logits = h W^T
        dy, dmemory = self.decoder.backward(dh)               # through every decoder layer
        dtgt_embedded = self.positional.backward(self.tgt_dropout.backward(dy))
        self.tgt_embed.backward(dtgt_embedded)                # tied: adds into the same dW
        dx = self.encoder.backward(dmemory)                   # memory's gradient from all layers
        dsrc_embedded = self.positional.backward(self.src_dropout.backward(dx))
        self.src_embed.backward(dsrc_embedded)
