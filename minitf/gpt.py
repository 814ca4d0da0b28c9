"""The decoder-only Transformer (GPT): the decoder's masked self-attention and feed-forward
blocks without cross-attention, trained to predict the next token. Every piece is a layer the
encoder-decoder uses; what separates the paper's decoder, GPT-1 and GPT-2 is constructor options:

    option            the paper's decoder   GPT-1 (2018)        GPT-2 (2019, the default)
    pre_norm          False (post-LN)       False               True, with a final LayerNorm
    activation        "relu"                "gelu_tanh"         "gelu_tanh"
    positions         "sinusoidal"          "learned"           "learned"
    scale_embedding   True (x sqrt(D))      False               False
    init              "xavier"              "normal" (0.02)     "gpt2": normal(0, 0.02), residual
                                                                projections / sqrt(2 x layers)

(``GPT.preset(name, vocab_size, ...)`` fills in one column.) Hugging Face GPT-2 folders are the
language-model kind's (:mod:`minitf.lm.gpt2`); sampling with the key/value cache is
:func:`minitf.sampling.generate`.

Shapes: B batch, L sequence length, D d_model, V vocabulary size.
"""
import dataclasses
import math

from minitf import backend
from minitf.layers import (ACTIVATIONS, Dropout, Embedding, LearnedPositionalEmbedding,
                           OutputProjection, PositionalEncoding)
from minitf.module import Module
from minitf.transformer import Decoder, check_ids

POSITIONS = ("learned", "sinusoidal")
INITS = ("gpt2", "normal", "xavier")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """A GPT's shape and choices: what ``GPT.from_config`` needs (defaults: GPT-2 small, 124M
    parameters, but for the vocabulary size)."""
    vocab_size: int
    max_len: int = 1024
    d_model: int = 768
    num_heads: int = 12
    num_layers: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    pre_norm: bool = True
    activation: str = "gelu_tanh"
    positions: str = "learned"
    scale_embedding: bool = False
    init: str = "gpt2"
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5
    tie_embeddings: bool = True


PRESETS = {
    "paper": dict(pre_norm=False, activation="relu", positions="sinusoidal", scale_embedding=True, init="xavier"),
    "gpt1": dict(pre_norm=False, activation="gelu_tanh", positions="learned", scale_embedding=False, init="normal"),
    "gpt2": dict(pre_norm=True, activation="gelu_tanh", positions="learned", scale_embedding=False, init="gpt2"),
}


class GPT(Module):
    """Decoder-only Transformer: ``model(ids)`` takes token ids (B, L) and returns next-token
    logits (B, L, V); position t sees tokens 0..t only.

    Parts: ``embed`` (token embedding, tied to the output projection ``generator`` unless
    ``tie_embeddings=False``), ``positional`` (learned table or sinusoids), ``dropout`` on their
    sum, ``decoder`` (a :class:`minitf.transformer.Decoder` without cross-attention, with its final
    LayerNorm when pre-LN), ``generator``. The next-token loss is
    ``LabelSmoothedCrossEntropy(0.0, ignore_index=-1)(model(ids[:, :-1]), ids[:, 1:])``.
    """

    def __init__(self, vocab_size, max_len=1024, d_model=768, num_heads=12, num_layers=12, d_ff=3072, dropout=0.1,
                 pre_norm=True, activation="gelu_tanh", positions="learned", scale_embedding=False, init="gpt2",
                 init_std=0.02, layer_norm_eps=1e-5, tie_embeddings=True):
        for name, value in [("vocab_size", vocab_size), ("max_len", max_len), ("d_model", d_model),
                            ("num_heads", num_heads), ("num_layers", num_layers), ("d_ff", d_ff)]:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
        for name, value, allowed in [("activation", activation, tuple(ACTIVATIONS)), ("positions", positions, POSITIONS),
                                     ("init", init, INITS)]:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        self.config = dict(vocab_size=vocab_size, max_len=max_len, d_model=d_model, num_heads=num_heads,
                           num_layers=num_layers, d_ff=d_ff, dropout=dropout, pre_norm=pre_norm, activation=activation,
                           positions=positions, scale_embedding=scale_embedding, init=init, init_std=init_std,
                           layer_norm_eps=layer_norm_eps, tie_embeddings=tie_embeddings)
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed = Embedding(vocab_size, d_model, scale=scale_embedding)
        self.positional = (LearnedPositionalEmbedding(max_len, d_model, init_std) if positions == "learned"
                           else PositionalEncoding(d_model))
        self.dropout = Dropout(dropout)
        self.decoder = Decoder(num_layers, d_model, num_heads, d_ff, dropout, pre_norm, activation,
                               cross_attention=False, layer_norm_eps=layer_norm_eps)  # GPT-2's layer_norm_epsilon
        # tied (paper 3.4, GPT-2): the embedding's own weight; untied: a weight of its own
        self.generator = OutputProjection(self.embed.weight if tie_embeddings
                                          else Embedding(vocab_size, d_model).weight)
        if init != "xavier":
            self.init_normal(init_std, residual_scaling=init == "gpt2")

    def init_normal(self, std, residual_scaling):
        """Every weight matrix and table ~ N(0, std^2), biases 0, LayerNorm gains 1 (GPT-1, GPT-2).
        With ``residual_scaling`` (GPT-2, section 2.3), the two projections that write into the
        residual stream in each layer (attention's W^O, the feed-forward's second linear) get
        std / sqrt(2 x layers): the stream adds 2 x layers of them, and its variance stays O(1)."""
        rng = backend.init_rng()
        residual_std = std / math.sqrt(2 * self.config["num_layers"])
        for name, p in self.named_parameters():
            if p.data.ndim != 2:  # biases and LayerNorm's gamma and beta keep their 0 and 1
                continue
            scaled = residual_scaling and name.endswith(("self_attn.w_o", "feed_forward.linear2.weight"))
            p.data[...] = backend.asarray(rng.normal(0.0, residual_std if scaled else std, p.shape), dtype=p.data.dtype)

    @classmethod
    def from_config(cls, config):
        """Build the model a :class:`GPTConfig` (or its dict) describes."""
        return cls(**(dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)))

    @classmethod
    def preset(cls, name, vocab_size, **options):
        """The model of one column of the module's table ("paper", "gpt1" or "gpt2"), with
        ``options`` (sizes, dropout...) on top."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {name!r}")
        return cls(vocab_size, **(PRESETS[name] | options))

    @property
    def position_limit(self):
        """The positions the model has (its learned table's rows), or None (sinusoids: any length).
        :func:`minitf.sampling.generate` asks every model this, whatever its kind."""
        return self.max_len if self.config["positions"] == "learned" else None

    # -- forward / backward ---------------------------------------------------------
    def forward(self, ids, cache=None, start=0):
        """ids (B, L) integer array -> logits (B, L, V). With ``cache`` (a dict, no_grad only),
        ``ids`` holds only the new positions, the first at position ``start``; the keys and values
        of the earlier positions come from the cache (:func:`minitf.sampling.generate`)."""
        ids = check_ids(ids, "ids", self.vocab_size)
        x = self.embed(ids)                                      # W[ids] (* sqrt(D) in the paper)
        x = self.dropout(self.positional(x, start=start))        # + positions, then dropout
        h = self.decoder(x, cache=cache)                         # N masked blocks (+ final LayerNorm)
        return self.generator(h)                                 # logits = h W^T

    def backward(self, dlogits):
        """dlogits (B, L, V) -> fills ``p.grad`` of every parameter (accumulating)."""
        dh = self.generator.backward(dlogits)                    # logits = h W^T
        dx, _ = self.decoder.backward(dh)                        # no encoder: no memory gradient
        dembedded = self.positional.backward(self.dropout.backward(dx))
        self.embed.backward(dembedded)                           # tied: adds into the generator's dW
