"""The decoder-only Transformer (GPT): the decoder's masked self-attention and feed-forward
blocks without cross-attention, trained to predict the next token. Every piece is a layer the
encoder-decoder uses; what separates the paper's decoder, GPT-1 and GPT-2 is options (:class:`GPTConfig`'s
fields, ``GPT``'s keywords):

    option            the paper's decoder   GPT-1 (2018)        GPT-2 (2019, the default)
    pre_norm          False (post-LN)       False               True, with a final LayerNorm
    activation        "relu"                "gelu_tanh"         "gelu_tanh"
    positions         "sinusoidal"          "learned"           "learned"
    scale_embedding   True (x sqrt(D))      False               False
    init              "xavier"              "normal" (0.02)     "gpt2": normal(0, 0.02), residual
                                                                projections / sqrt(2 x layers)

(``GPT.preset(name, vocab_size, ...)`` fills in one column.) ``model.config`` is the frozen
:class:`GPTConfig` the model was built from. Hugging Face GPT-2 folders are the language-model kind's
(:mod:`minitf.lm.gpt2`); sampling with the key/value cache is :func:`minitf.sampling.generate`.

Shapes: B batch, L sequence length, D d_model, V vocabulary size.
"""
import dataclasses
import math

from minitf import backend
from minitf.layers import (ACTIVATIONS, Dropout, Embedding, LearnedPositionalEmbedding,
                           OutputProjection, PositionalEncoding)
from minitf.module import Module
from minitf.transformer import Decoder, check_ids, check_sizes

POSITIONS = ("learned", "sinusoidal")
INITS = ("gpt2", "normal", "xavier")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """A GPT's shape and choices, declared and checked here only (defaults: GPT-2 small, 124M
    parameters, but for the vocabulary size); a GPT's ``config``. A bad value is a ValueError naming it.

    ``dropout``: on the embeddings and every sublayer's output (GPT-2's resid_pdrop and embd_pdrop);
    ``attention_dropout``: on the attention weights (GPT-2's attn_pdrop). Its default is 0, not GPT-2's 0.1: a
    GPT built from scratch (a ``--model gpt`` run too) has none, as the paper's decoder; a GPT-2 folder's model
    gets the folder's attn_pdrop (:mod:`minitf.lm.gpt2`)."""
    vocab_size: int
    max_len: int = 1024
    d_model: int = 768
    num_heads: int = 12
    num_layers: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.0
    pre_norm: bool = True
    activation: str = "gelu_tanh"
    positions: str = "learned"
    scale_embedding: bool = False
    init: str = "gpt2"
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self):
        check_sizes(self, ("vocab_size", "max_len", "d_model", "num_heads", "num_layers", "d_ff"))
        for name, allowed in [("activation", tuple(ACTIVATIONS)), ("positions", POSITIONS), ("init", INITS)]:
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")


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

    def __init__(self, vocab_size, **options):
        """``options``: any :class:`GPTConfig` field by name (``max_len``, ``d_model``, ``activation``,
        ``layer_norm_eps``...); the defaults and the checks are the dataclass's, declared once there."""
        fields = [f.name for f in dataclasses.fields(GPTConfig)]
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise TypeError(f"GPT has no option {', '.join(map(repr, unknown))}; give GPTConfig's fields only: "
                            f"{', '.join(fields[1:])}")
        self.config = c = GPTConfig(vocab_size, **options)
        self.vocab_size, self.max_len = c.vocab_size, c.max_len
        self.embed = Embedding(c.vocab_size, c.d_model, scale=c.scale_embedding)
        self.positional = (LearnedPositionalEmbedding(c.max_len, c.d_model, c.init_std) if c.positions == "learned"
                           else PositionalEncoding(c.d_model))
        self.dropout = Dropout(c.dropout)
        self.decoder = Decoder(c.num_layers, c.d_model, c.num_heads, c.d_ff, c.dropout, c.pre_norm, c.activation,
                               cross_attention=False, layer_norm_eps=c.layer_norm_eps,  # GPT-2's layer_norm_epsilon
                               attention_dropout=c.attention_dropout)
        # tied (paper 3.4, GPT-2): the embedding's own weight; untied: a weight of its own
        self.generator = OutputProjection(self.embed.weight if c.tie_embeddings
                                          else Embedding(c.vocab_size, c.d_model).weight)
        if c.init != "xavier":
            self.init_normal(c.init_std, residual_scaling=c.init == "gpt2")

    def init_normal(self, std, residual_scaling):
        """Every weight matrix and table ~ N(0, std^2), biases 0, LayerNorm gains 1 (GPT-1, GPT-2).
        With ``residual_scaling`` (GPT-2, section 2.3), the two projections that write into the
        residual stream in each layer (attention's W^O, the feed-forward's second linear) get
        std / sqrt(2 x layers): the stream adds 2 x layers of them, and its variance stays O(1)."""
        rng = backend.init_rng()
        residual_std = std / math.sqrt(2 * self.config.num_layers)
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
        return self.max_len if self.config.positions == "learned" else None

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
