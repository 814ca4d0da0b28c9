"""minitf: the Transformer of "Attention Is All You Need", built from scratch on
NumPy (CPU) and CuPy (GPU), with a hand-written backward pass for every layer; and the
decoder-only GPT from the same layers (minitf.gpt).

Dimension glossary: B batch, S source length, T target length, D d_model,
H heads, dk = D / H, F d_ff, V vocabulary size.
"""
from minitf.backend import (get_default_dtype, get_device, manual_seed, set_default_dtype, set_device,
                            to_numpy)
from minitf.module import Module, ModuleList, Parameter, no_grad
from minitf.layers import (GELU, Dropout, Embedding, LayerNorm, LearnedPositionalEmbedding, Linear,
                           OutputProjection, PositionalEncoding, ReLU, RMSNorm, SiLU, Softmax, SwiGLU,
                           softmax, softmax_backward)
from minitf.rotary import RotaryEmbedding
from minitf.attention import (GroupedQueryAttention, MultiHeadAttention, scaled_dot_product_attention,
                              scaled_dot_product_attention_backward)
from minitf.transformer import (Decoder, DecoderLayer, Encoder, EncoderLayer, FeedForward, SublayerConnection,
                                Transformer, TransformerConfig)
from minitf.gpt import GPT, GPTConfig
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.optim import Adam, WarmupSchedule, clip_grad_norm

__version__ = "0.1.0"


def load(path, warn=None):
    """The model of a run folder, a checkpoint folder or a Hugging Face folder of any kind minitf reads, with its
    tokenizer and decoding settings (:func:`minitf.loader.load`, which the commands use): ``.model``,
    ``.tokenizer``, ``.decoding``, ``.kind``."""
    from minitf.loader import load as load_any  # the application's loader, imported only when asked for
    return load_any(path, warn)


def save_pretrained(loaded_or_model, folder):
    """Write what :func:`load` returned (a run, a checkpoint or a Hugging Face folder of any kind), or a bare model of
    any kind, as a Hugging Face folder that transformers reads (:func:`minitf.loader.save_pretrained`: the model's
    format, config.json, generation settings and tokenizer); the one writer beside the one loader."""
    from minitf.loader import save_pretrained as save_any  # the application's writer, imported when asked for
    return save_any(loaded_or_model, folder)
