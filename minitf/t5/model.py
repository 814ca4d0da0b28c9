"""T5 (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer"): the
encoder-decoder of the paper's shape, changed in four places a learner of backprop should see (docs/t5.md):

    positions     no sinusoids: a learned bias per head and bucket of (key position - query position) added to the
                  attention scores (bidirectional buckets in the encoder, the past only in the decoder), computed by
                  the first layer of each stack and added by all of them; none in cross-attention
    norm          RMSNorm before each sublayer (pre-norm), no centring, no bias; a final one after each stack
    attention     the scores are not divided by sqrt(dk)
    feed-forward  ReLU (v1.0), or gated: act(x W_0) * (x W_1) (v1.1, flan-t5, mT5: GELU's tanh form)

and the output: the embedding's matrix (tied) applied to the decoder's output times d_model^-0.5 (v1.0), or an
lm_head of its own without the factor (v1.1). No linear layer has a bias.

Every layer is one of minitf's (Embedding, RMSNorm, Linear, Dropout, ReLU/GELU, OutputProjection,
:class:`minitf.attention.T5Attention`, :class:`minitf.attention.RelativePositionBias`), each with its own backward;
the backward here walks the blocks in reverse, adding the residual paths, and sums the position bias's gradient
over every layer of a stack before its one scatter-add. Hugging Face's names and layouts: :mod:`minitf.t5.hf`.

Shapes: B batch, S source length, T target length, D d_model, H heads, dk d_kv, F d_ff, V vocabulary size.
"""
from minitf import backend
from minitf.attention import RelativePositionBias, T5Attention
from minitf.layers import Dropout, Embedding, Linear, OutputProjection, RMSNorm, make_activation
from minitf.module import Module, ModuleList
from minitf.t5 import hf
from minitf.t5.config import T5Config
from minitf.transformer import check_ids

class T5FeedForward(Module):
    """``y = wo(dropout(act(wi(x))))`` (v1.0), or gated ``y = wo(dropout(act(wi_0(x)) * wi_1(x)))`` (v1.1);
    :class:`Linear` layers without biases, Hugging Face's names. x, y (..., D)."""

    def __init__(self, d_model, d_ff, activation="relu", gated=False, dropout=0.0):
        self.gated = gated
        if gated:
            self.wi_0 = Linear(d_model, d_ff, bias=False)
            self.wi_1 = Linear(d_model, d_ff, bias=False)
        else:
            self.wi = Linear(d_model, d_ff, bias=False)
        self.wo = Linear(d_ff, d_model, bias=False)
        self.act = make_activation(activation)
        self.dropout = Dropout(dropout)

    def forward(self, x):
        if not self.gated:
            return self.wo(self.dropout(self.act(self.wi(x))))      # y = act(x W_i) W_o  (..., D)
        a = self.act(self.wi_0(x))                                   # a = act(x W_0)  (..., F)
        u = self.wi_1(x)                                             # u = x W_1  (..., F)
        self.save_for_backward(a, u)
        return self.wo(self.dropout(a * u))                          # y = (a * u) W_o  (..., D)

    def backward(self, dy):
        """dy (..., D) -> dx (..., D); adds the gradients of the projections."""
        dh = self.dropout.backward(self.wo.backward(dy))             # y = dropout(h) W_o  =>  dh  (..., F)
        if not self.gated:
            return self.wi.backward(self.act.backward(dh))           # h = act(x W_i)
        a, u = self.saved_tensors()
        # h = a * u  =>  da = dh * u,  du = dh * a  (the product rule: each factor's gradient is the other's value)
        da, du = dh * u, dh * a
        # u = x W_1 and a = act(x W_0) both read x  =>  dx is the sum of the two paths
        return self.wi_1.backward(du) + self.wi_0.backward(self.act.backward(da))


class T5Block(Module):
    """One pre-norm block (Hugging Face's ``T5Block``): ``h = x + dropout(self_attn(norm(x)))``, in the decoder
    ``h = h + dropout(cross_attn(norm(h), memory))``, ``y = h + dropout(ff(norm(h)))``. x, y (B, L, D). Each
    attention drops its weights too, with the same ``dropout_rate`` (as Hugging Face's T5Attention)."""

    def __init__(self, config, is_decoder):
        c, D = config, config.d_model
        self.is_decoder = is_decoder
        self.self_attn_norm = RMSNorm(D, c.layer_norm_epsilon)
        self.self_attn = T5Attention(D, c.num_heads, c.d_kv, c.dropout_rate)
        self.self_attn_dropout = Dropout(c.dropout_rate)
        if is_decoder:
            self.cross_attn_norm = RMSNorm(D, c.layer_norm_epsilon)
            self.cross_attn = T5Attention(D, c.num_heads, c.d_kv, c.dropout_rate)
            self.cross_attn_dropout = Dropout(c.dropout_rate)
        self.ff_norm = RMSNorm(D, c.layer_norm_epsilon)
        self.ff = T5FeedForward(D, c.d_ff, c.activation, c.gated, c.dropout_rate)
        self.ff_dropout = Dropout(c.dropout_rate)

    def forward(self, x, bias, key_padding_mask=None, memory=None, memory_padding_mask=None, cache=None):
        """x (B, L, D); bias (1, H, L, Lk) the stack's position bias; the decoder's memory (B, S, D) and its
        padding (B, S); cache: this block's decoding cache (a dict: "self", "cross")."""
        self_cache = None if cache is None else cache.setdefault("self", {})
        h = x + self.self_attn_dropout(self.self_attn(self.self_attn_norm(x), bias=bias, causal=self.is_decoder,
                                                      key_padding_mask=key_padding_mask, cache=self_cache))
        if self.is_decoder:
            cross_cache = None if cache is None else cache.setdefault("cross", {})
            h = h + self.cross_attn_dropout(self.cross_attn(self.cross_attn_norm(h), memory,
                                                            key_padding_mask=memory_padding_mask, cache=cross_cache))
        return h + self.ff_dropout(self.ff(self.ff_norm(h)))

    def backward(self, dy):
        """dy (B, L, D) -> (dx (B, L, D), dmemory (B, S, D) or None, dbias (H, L, Lk): the bias's gradient)."""
        # y = h + dropout(ff(norm(h)))  =>  dh = dy (the residual) + the path through the feed-forward
        dh = dy + self.ff_norm.backward(self.ff.backward(self.ff_dropout.backward(dy)))
        dmemory = None
        if self.is_decoder:
            # h = h0 + dropout(cross_attn(norm(h0), memory))  =>  dh0 = dh + the path through the attention
            dq, dmemory, _ = self.cross_attn.backward(self.cross_attn_dropout.backward(dh))
            dh = dh + self.cross_attn_norm.backward(dq)
        # h = x + dropout(self_attn(norm(x), bias))  =>  dx = dh + the path through the attention; dbias from it
        dn, _, dbias = self.self_attn.backward(self.self_attn_dropout.backward(dh))
        return dh + self.self_attn_norm.backward(dn), dmemory, dbias


class T5Stack(Module):
    """The encoder (``is_decoder`` False) or the decoder: dropout on the embedded input, the blocks, a final
    RMSNorm and dropout. ``relative_attention_bias`` (a :class:`RelativePositionBias`, Hugging Face's first block's
    ``relative_attention_bias``): the position bias every block of the stack adds; bidirectional in the encoder,
    the past only in the decoder."""

    def __init__(self, config, is_decoder):
        c = config
        self.is_decoder = is_decoder
        self.dropout = Dropout(c.dropout_rate)
        self.relative_attention_bias = RelativePositionBias(c.num_heads, c.relative_attention_num_buckets,
                                                            c.relative_attention_max_distance,
                                                            bidirectional=not is_decoder)
        self.block = ModuleList([T5Block(c, is_decoder)
                                 for _ in range(c.num_decoder_layers if is_decoder else c.num_layers)])
        self.final_layer_norm = RMSNorm(c.d_model, c.layer_norm_epsilon)
        self.final_dropout = Dropout(c.dropout_rate)

    def forward(self, x, key_padding_mask=None, memory=None, memory_padding_mask=None, cache=None):
        """x (B, L, D) the embedded tokens; key_padding_mask (B, L) True = padding (the decoder's: over the cached
        positions and these); with ``cache`` (decoding) x holds the new positions, after the cached ones."""
        start = 0 if cache is None else cache.get(0, {}).get("self", {}).get("length", 0)
        L = x.shape[1]
        bias = self.relative_attention_bias(L, start + L, start)    # (1, H, L, start + L), shared by every block
        h = self.dropout(x)
        for i, block in enumerate(self.block):
            h = block(h, bias, key_padding_mask, memory, memory_padding_mask,
                      None if cache is None else cache.setdefault(i, {}))
        return self.final_dropout(self.final_layer_norm(h))

    def backward(self, dy):
        """dy (B, L, D) -> (dx (B, L, D), dmemory (B, S, D) or None); adds every parameter's gradient."""
        dh = self.final_layer_norm.backward(self.final_dropout.backward(dy))
        dmemory, dbias = None, 0
        for block in reversed(list(self.block)):
            dh, dmemory_block, dbias_block = block.backward(dh)
            dbias = dbias + dbias_block                             # every block added the same bias: sum
            if dmemory_block is not None:                           # every decoder block read the memory: sum
                dmemory = dmemory_block if dmemory is None else dmemory + dmemory_block
        self.relative_attention_bias.backward(dbias)                # one scatter-add of all the blocks' sum
        return self.dropout.backward(dh), dmemory


class T5(Module):
    """T5's encoder-decoder: ``model(input_ids, decoder_input_ids, key_padding_mask=...)`` takes token ids (B, S)
    and (B, T) and returns logits (B, T, V); ``key_padding_mask`` (B, S) bool, True = padding (the inverse of
    Hugging Face's attention_mask), ``decoder_key_padding_mask`` (B, T) likewise (default: the causal mask only, as
    transformers: the decoder starts from pad, which stays visible). ``backward(dlogits)`` fills every gradient.

    Parts (Hugging Face's names where it has them): ``shared`` (the one embedding, no scale), ``encoder`` and
    ``decoder`` (:class:`T5Stack`), ``lm_head`` (an :class:`OutputProjection` whose weight is ``shared.weight``
    when tied). For decoding, ``encode(src_ids, src_padding_mask)`` and ``decode(tgt_ids, memory,
    src_padding_mask, cache=, start=)``: the interface of :class:`minitf.transformer.Transformer` that
    :mod:`minitf.nmt.decode`'s greedy and beam search read (with ``config.decoder_start_id``, ``eos_id``,
    ``pad_id``, ``src_vocab_size``, ``tgt_vocab_size``).
    """

    def __init__(self, config):
        if not isinstance(config, T5Config):
            raise ValueError(f"T5 is built from a T5Config, got {type(config).__name__}")
        self.config = c = config
        self.pad_id = c.pad_token_id  # the loss's ignored id where a study tool asks the model (as the Transformer's)
        self.shared = Embedding(c.vocab_size, c.d_model, scale=False)
        self.encoder = T5Stack(c, is_decoder=False)
        self.decoder = T5Stack(c, is_decoder=True)
        self.lm_head = OutputProjection(self.shared.weight if c.tie_word_embeddings
                                        else Embedding(c.vocab_size, c.d_model).weight)
        self.output_scale = c.d_model ** -0.5 if c.scale_decoder_outputs else 1.0
        self.init_weights()

    @classmethod
    def from_config(cls, config=None, **fields):
        """The model of a :class:`T5Config` (or its fields as keywords)."""
        return cls(config.replace(**fields) if config is not None else T5Config(**fields))

    def init_weights(self):
        """Hugging Face's ``T5PreTrainedModel._init_weights``: every matrix normal with standard deviation
        ``initializer_factor`` times: 1 for the embedding and lm_head, (D dk)^-1/2 for W^Q, D^-1/2 for W^K, W^V,
        wi and the bias tables, (H dk)^-1/2 for W^O, F^-1/2 for wo; the norms' gains 1."""
        c, rng = self.config, backend.init_rng()
        D, E, H, F = c.d_model, c.d_kv, c.num_heads, c.d_ff
        stds = {"shared.weight": 1.0, "lm_head.weight": 1.0, ".q.weight": (D * E) ** -0.5, ".k.weight": D ** -0.5,
                ".v.weight": D ** -0.5, ".o.weight": (H * E) ** -0.5, ".wi.weight": D ** -0.5,
                ".wi_0.weight": D ** -0.5, ".wi_1.weight": D ** -0.5, ".wo.weight": F ** -0.5,
                "relative_attention_bias.weight": D ** -0.5}
        for name, p in self.named_parameters():
            std = next((s for suffix, s in stds.items() if name.endswith(suffix)), None)
            if std is not None:
                p.data[...] = backend.asarray(rng.normal(0.0, c.initializer_factor * std, p.shape),
                                              dtype=p.data.dtype)

    # -- forward / backward ---------------------------------------------------------
    def encode(self, src_ids, src_padding_mask=None):
        """src_ids (B, S) -> memory (B, S, D) and the source padding mask (B, S) as given (None: no padding)."""
        return self.encoder(self.shared(src_ids), src_padding_mask), src_padding_mask

    def decode(self, tgt_ids, memory, src_padding_mask=None, cache=None, start=0, tgt_padding_mask=None):
        """tgt_ids (B, T) -> logits (B, T, V) (memory (B, S, D), or one row per sentence of G beams while
        decoding). With ``cache`` (a dict, no_grad only) ``tgt_ids`` holds only the new positions, starting at
        ``start``, which must be the cache's length."""
        if cache is not None:
            cached = cache.get(0, {}).get("self", {}).get("length", 0)
            if start != cached:
                raise ValueError(f"start {start} is not the cache's length {cached}: the new tokens go right after "
                                 "the cached ones")
        elif start:
            raise ValueError("start is for decoding with a cache (the positions of the cached tokens come first)")
        h = self.decoder(self.shared(tgt_ids), tgt_padding_mask, memory, src_padding_mask, cache)
        if self.output_scale != 1.0:
            h = h * self.output_scale                               # v1.0: the tied matrix on h * D^-1/2
        return self.lm_head(h)                                      # logits = h W^T  (B, T, V)

    def forward(self, input_ids, decoder_input_ids, key_padding_mask=None, decoder_key_padding_mask=None):
        """input_ids (B, S), decoder_input_ids (B, T) -> logits (B, T, V)."""
        V = self.config.vocab_size
        input_ids = check_ids(input_ids, "input_ids", V)
        decoder_input_ids = check_ids(decoder_input_ids, "decoder_input_ids", V)
        if input_ids.shape[0] != decoder_input_ids.shape[0]:
            raise ValueError(f"input_ids and decoder_input_ids must have the same batch size, got "
                             f"{input_ids.shape[0]} and {decoder_input_ids.shape[0]}")
        for name, mask, ids in (("key_padding_mask", key_padding_mask, input_ids),
                                ("decoder_key_padding_mask", decoder_key_padding_mask, decoder_input_ids)):
            if mask is not None and (tuple(mask.shape) != tuple(ids.shape) or mask.dtype != bool):
                raise ValueError(f"{name} must be a bool array of the ids' shape {tuple(ids.shape)} (True = "
                                 f"padding), got {mask.dtype} {tuple(mask.shape)}")
        key_padding_mask = None if key_padding_mask is None else backend.asarray(key_padding_mask)
        if decoder_key_padding_mask is not None:
            decoder_key_padding_mask = backend.asarray(decoder_key_padding_mask)
        memory, _ = self.encode(input_ids, key_padding_mask)
        return self.decode(decoder_input_ids, memory, key_padding_mask, tgt_padding_mask=decoder_key_padding_mask)

    def backward(self, dlogits):
        """dlogits (B, T, V) -> fills ``p.grad`` of every parameter (accumulating)."""
        dh = self.lm_head.backward(dlogits)                         # logits = h W^T
        if self.output_scale != 1.0:
            dh = dh * self.output_scale                             # h = h_dec * D^-1/2  =>  dh_dec = dh * D^-1/2
        dy, dmemory = self.decoder.backward(dh)                     # through every decoder block
        self.shared.backward(dy)                                    # the decoder's lookups (tied: into lm_head's dW)
        dx, _ = self.encoder.backward(dmemory)                      # memory's gradient from every decoder block
        self.shared.backward(dx)                                    # the encoder's lookups

    def num_parameters_of_shape(self):
        """The parameters a model of this config has, counted from the config alone."""
        c = self.config
        D, F, inner = c.d_model, c.d_ff, c.num_heads * c.d_kv
        attn, ff = 4 * D * inner + D, (3 if c.gated else 2) * D * F + D
        stacks = c.num_layers * (attn + ff) + c.num_decoder_layers * (2 * attn + ff)
        tables = 2 * c.relative_attention_num_buckets * c.num_heads
        return c.vocab_size * D * (1 if c.tie_word_embeddings else 2) + stacks + tables + 2 * D

    # -- Hugging Face folders -------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder, dtype=None):
        """The model of a Hugging Face T5 or mT5 folder (:func:`minitf.t5.hf.from_pretrained`)."""
        return hf.from_pretrained(cls, folder, dtype)

    def save_pretrained(self, folder, hf_config=None):
        """Write this model as a Hugging Face folder (:func:`minitf.t5.hf.save_pretrained`)."""
        hf.save_pretrained(self, folder, hf_config)

