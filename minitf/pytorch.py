"""minitf <-> PyTorch: the same model as a ``torch.nn.Module`` around ``torch.nn.Transformer``,
and conversions of the parameters both ways, so a model trained here runs there and back.

    import minitf.pytorch as mp
    torch_model = mp.to_torch(model)          # minitf.Transformer -> TorchTransformer
    model = mp.from_torch(torch_model)        # and back

Needs PyTorch (``pip install -e ".[bench]"``); ``import minitf`` does not import it.
docs/pytorch.md maps every parameter and states each difference; tests/test_pytorch_parity.py
checks logits, loss and every gradient against autograd in float64.

Layouts: minitf's ``Linear`` stores ``W`` as (d_in, d_out) with ``y = x W + b``; PyTorch's
``nn.Linear`` stores (d_out, d_in) with ``y = x W^T + b``. So every weight matrix of a linear map
is transposed on the way, including ``w_qkv`` (D, 3D) -> ``in_proj_weight`` (3D, D), whose rows
are [W^Q; W^K; W^V] in the same order. Embeddings and the output projection are (V, D) in both.
"""
import math
import warnings

import torch
from torch import nn

from minitf import backend
from minitf.transformer import TransformerConfig

# one minitf layer's parameter names -> the nn.Transformer layer's, and whether the array is transposed
_ATTENTION = [("w_qkv", "in_proj_weight", True), ("b_qkv", "in_proj_bias", False),
              ("w_o", "out_proj.weight", True), ("b_o", "out_proj.bias", False)]
_FEED_FORWARD = [("feed_forward.linear1.weight", "linear1.weight", True), ("feed_forward.linear1.bias", "linear1.bias", False),
                 ("feed_forward.linear2.weight", "linear2.weight", True), ("feed_forward.linear2.bias", "linear2.bias", False)]


def _norm(minitf_prefix, torch_prefix):
    return [(minitf_prefix + "gamma", torch_prefix + "weight", False), (minitf_prefix + "beta", torch_prefix + "bias", False)]


#: TransformerConfig's options whose value here is the paper's, the only one nn.Transformer computes
PAPER_OPTIONS = dict(activation="relu", positions="interleaved", scale_embedding=True, output_bias=False,
                     layer_norm_eps=1e-5, mask_target_padding=True, freeze_pad_embedding=False, tie_target_output=False)


def _config(config):
    """The :class:`minitf.TransformerConfig` of a model, of a dict of its constructor arguments, or itself."""
    config = getattr(config, "config", config)  # a minitf.Transformer keeps its TransformerConfig in .config
    return config if isinstance(config, TransformerConfig) else TransformerConfig(**config)


def parameter_map(config):
    """``[(minitf name, torch name, transposed)]`` for every parameter of a model with this
    config (a ``minitf.Transformer``, its ``.config`` (a ``TransformerConfig``) or a dict of its arguments).

    minitf names are ``Transformer.named_parameters()``'s; torch names are
    :class:`TorchTransformer`'s ``named_parameters()`` (a tied weight appears once in each)."""
    c = _config(config)
    pairs = [("src_embed.weight", "src_embed.weight", False)]
    if not c.share_embeddings:
        pairs += [("tgt_embed.weight", "tgt_embed.weight", False), ("generator.weight", "generator.weight", False)]
    for i in range(c.num_encoder_layers):
        m, t = f"encoder.layers.{i}.", f"transformer.encoder.layers.{i}."
        pairs += [(m + "self_attn." + a, t + "self_attn." + b, tr) for a, b, tr in _ATTENTION]
        pairs += _norm(m + "attn_block.norm.", t + "norm1.")
        pairs += [(m + a, t + b, tr) for a, b, tr in _FEED_FORWARD]
        pairs += _norm(m + "ff_block.norm.", t + "norm2.")
    if c.pre_norm:
        pairs += _norm("encoder.final_norm.", "transformer.encoder.norm.")
    for i in range(c.num_decoder_layers):
        m, t = f"decoder.layers.{i}.", f"transformer.decoder.layers.{i}."
        pairs += [(m + "self_attn." + a, t + "self_attn." + b, tr) for a, b, tr in _ATTENTION]
        pairs += _norm(m + "self_attn_block.norm.", t + "norm1.")
        pairs += [(m + "cross_attn." + a, t + "multihead_attn." + b, tr) for a, b, tr in _ATTENTION]
        pairs += _norm(m + "cross_attn_block.norm.", t + "norm2.")
        pairs += [(m + a, t + b, tr) for a, b, tr in _FEED_FORWARD]
        pairs += _norm(m + "ff_block.norm.", t + "norm3.")
    if c.pre_norm:
        pairs += _norm("decoder.final_norm.", "transformer.decoder.norm.")
    return pairs


class TorchTransformer(nn.Module):
    """minitf's ``Transformer`` in PyTorch: ``torch.nn.Transformer`` (``batch_first``) plus what
    lives outside it: embeddings scaled by sqrt(D), sinusoidal positions, dropout on their sum,
    padding masks from ``pad_id``, the causal mask, and the output projection (tied to the
    embedding with ``share_embeddings``).

    Made to compute exactly minitf's function: dropout only where minitf has it (sublayer
    outputs and embeddings; none inside the FFN, none on the attention weights), and with
    post-LN (``pre_norm=False``) no final encoder and decoder norms, which ``nn.Transformer``
    always adds (they are set to None, TransformerEncoder/Decoder's "no final norm").

    ``forward(src, tgt_in)``: LongTensors (B, S), (B, T) -> logits (B, T, V).
    """

    def __init__(self, config):
        super().__init__()
        c = _config(config)
        # nn.Transformer computes the paper's model only: a Marian option would convert without error and compute
        # something else (ReLU for SiLU, interleaved sinusoids for halves), so it is refused here
        departures = {key: getattr(c, key) for key, paper in PAPER_OPTIONS.items() if getattr(c, key) != paper}
        if departures:
            raise ValueError(f"TorchTransformer builds the paper's model only; this config departs from it: "
                             f"{departures} (compare such a model with transformers' MarianMTModel instead)")
        self.config = c
        D, p = c.d_model, c.dropout
        self.d_model, self.pad_id = D, c.pad_id
        self.src_embed = nn.Embedding(c.src_vocab_size, D)
        share = c.share_embeddings
        self.tgt_embed = self.src_embed if share else nn.Embedding(c.tgt_vocab_size, D)
        self.dropout = nn.Dropout(p)
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first": set False below
            warnings.filterwarnings("ignore", message="enable_nested_tensor")
            self.transformer = nn.Transformer(
                d_model=D, nhead=c.num_heads, num_encoder_layers=c.num_encoder_layers,
                num_decoder_layers=c.num_decoder_layers, dim_feedforward=c.d_ff, dropout=p,
                activation="relu", layer_norm_eps=1e-5, batch_first=True, norm_first=c.pre_norm)
        if not c.pre_norm:
            self.transformer.encoder.norm = None  # post-LN: every layer already ends in a norm
            self.transformer.decoder.norm = None
        self.transformer.encoder.enable_nested_tensor = False  # keep padded positions as they are
        for layer in list(self.transformer.encoder.layers) + list(self.transformer.decoder.layers):
            layer.dropout = nn.Identity()  # minitf has no dropout between the two FFN linears
            for attention in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attention is not None:
                    attention.dropout = 0.0  # ... nor on the attention weights
        self.generator = nn.Linear(D, c.tgt_vocab_size, bias=False)
        if share:
            self.generator.weight = self.tgt_embed.weight  # paper 3.4: one (V, D) matrix for all three

    def positions(self, length, dtype, device):
        """The sinusoidal table (length, D), computed in float64 as minitf does."""
        D = self.d_model
        position = torch.arange(length, dtype=torch.float64, device=device)[:, None]
        inv_freq = torch.exp(torch.arange(0, D, 2, dtype=torch.float64, device=device) * (-math.log(10000.0) / D))
        table = torch.zeros(length, D, dtype=torch.float64, device=device)
        table[:, 0::2] = torch.sin(position * inv_freq)
        table[:, 1::2] = torch.cos(position * inv_freq[: D // 2])
        return table.to(dtype)

    def forward(self, src, tgt_in):
        src_pad, tgt_pad = src == self.pad_id, tgt_in == self.pad_id  # True = padding, as in minitf
        scale = math.sqrt(self.d_model)
        x = self.src_embed(src) * scale
        x = self.dropout(x + self.positions(src.shape[1], x.dtype, x.device))
        y = self.tgt_embed(tgt_in) * scale
        y = self.dropout(y + self.positions(tgt_in.shape[1], y.dtype, y.device))
        T = tgt_in.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=src.device), diagonal=1)  # True = future
        h = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                             memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return self.generator(h)


def loss(logits, target, smoothing=0.1, ignore_index=0):
    """minitf's ``LabelSmoothedCrossEntropy`` in PyTorch: the same number, with no conversion.

    logits (B, T, V), target (B, T). Both put 1 - eps on the target and eps / V on every one of
    the V classes (pad included), and average over the targets that are not ``ignore_index``."""
    V = logits.shape[-1]
    return nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=ignore_index,
                                       label_smoothing=smoothing)


def _check_names(pairs, minitf_names, torch_names):
    missing = sorted(set(minitf_names) - {m for m, _, _ in pairs}) + sorted(set(torch_names) - {t for _, t, _ in pairs})
    extra = sorted({m for m, _, _ in pairs} - set(minitf_names)) + sorted({t for _, t, _ in pairs} - set(torch_names))
    if missing or extra:
        raise ValueError(f"parameter names do not match the conversion table: not converted {missing}, "
                         f"not found {extra}")


def to_torch_state(model):
    """``{torch name: float64-or-model-dtype torch.Tensor}`` of a minitf ``Transformer``, in
    PyTorch's layouts (linear weights transposed)."""
    state = model.state_dict()
    pairs = parameter_map(model)
    _check_names(pairs, state, [t for _, t, _ in pairs])
    return {t: torch.from_numpy(backend.host.ascontiguousarray(state[m].T if tr else state[m]))
            for m, t, tr in pairs}


def from_torch_state(torch_state, config):
    """``{minitf name: host numpy array}`` for ``Transformer.load_state_dict``, from a mapping of
    torch names to tensors (``dict(TorchTransformer.named_parameters())`` or a ``state_dict()``)."""
    out = {}
    for m, t, tr in parameter_map(config):
        array = torch_state[t].detach().cpu().numpy()
        out[m] = backend.host.ascontiguousarray(array.T if tr else array)
    return out


def to_torch(model, dtype=None):
    """A :class:`TorchTransformer` with the parameters of minitf ``model`` (copied), in ``dtype``
    (default: the model's own float dtype). Train mode as in ``model.training``."""
    torch_model = TorchTransformer(model.config)
    params = dict(torch_model.named_parameters())
    state = to_torch_state(model)
    _check_names(parameter_map(model), dict(model.named_parameters()), params)
    dtype = dtype or next(iter(state.values())).dtype
    torch_model.to(dtype)
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor)
    return torch_model.train(model.training)


def from_torch(torch_model, dtype=None):
    """A ``minitf.Transformer`` with the parameters of a :class:`TorchTransformer` (copied), built
    under ``dtype`` (default: minitf's default float dtype)."""
    import minitf
    with backend.default_dtype(dtype or backend.get_default_dtype()):
        model = minitf.Transformer.from_config(torch_model.config)
    params = dict(torch_model.named_parameters())
    _check_names(parameter_map(model), dict(model.named_parameters()), params)
    model.load_state_dict(from_torch_state(params, model))
    return model.train(torch_model.training)
