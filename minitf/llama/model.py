"""The Llama-family decoder: token embedding, N pre-norm blocks, a final RMSNorm and the output projection
(tied to the embedding or not). Each block changes GPT-2's in four places (docs/llama.md):

    h = x + attn(rmsnorm_1(x))     grouped-query attention, rotary positions on q and k (no added positions)
    y = h + swiglu(rmsnorm_2(h))   down(silu(gate(.)) * up(.)) instead of one activation between two linears

Every layer is one of minitf's (RMSNorm, SwiGLU, GroupedQueryAttention with RotaryEmbedding, Embedding,
OutputProjection), each with its own backward; the backward here only walks the blocks in reverse, adding the
residual paths. Parameter names are Hugging Face's without the ``model.`` prefix (``layers.0.self_attn.q_proj``),
its ``nn.Linear`` weights (out, in) stored as minitf's (in, out) (:mod:`minitf.llama.hf`).

Shapes: B batch, L sequence length, D d_model, V vocabulary size.
"""
from minitf import backend
from minitf.attention import GroupedQueryAttention
from minitf.layers import Embedding, OutputProjection, RMSNorm, SwiGLU
from minitf.llama import moe_hf
from minitf.llama.config import LlamaConfig
from minitf.module import Module, ModuleList
from minitf.moe import SparseMoE, aux_losses, backward_aux
from minitf.rotary import RotaryEmbedding
from minitf.transformer import check_ids


def rotary_of(config):
    """The :class:`RotaryEmbedding` of ``config``: rope_theta, and Llama 3's scaling where rope_scaling says so."""
    scaling = dict(config.rope_scaling or {})
    rope_type = scaling.pop("rope_type", "default")
    return RotaryEmbedding(config.head_size, float(config.rope_theta), rope_type, **scaling)


class LlamaBlock(Module):
    """One pre-norm block: ``h = x + self_attn(input_layernorm(x))``, ``y = h + mlp(post_attention_layernorm(h))``
    (Hugging Face's ``LlamaDecoderLayer``, names as there). x, y (B, L, D)."""

    def __init__(self, config, layer=0):
        D = config.d_model
        self.input_layernorm = RMSNorm(D, config.rms_norm_eps)
        self.self_attn = GroupedQueryAttention(D, config.num_heads, config.num_kv_heads, config.head_size,
                                               qkv_bias=config.attention_bias, rotary=rotary_of(config),
                                               qk_norm=config.qk_norm, norm_eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(D, config.rms_norm_eps)
        if config.is_sparse(layer):  # a mixture of experts (minitf.moe) in place of the one SwiGLU
            self.mlp = SparseMoE(D, config.expert_d_ff, config.num_experts, config.num_experts_per_tok,
                                 config.norm_topk_prob, config.shared_expert_d_ff)
        else:
            self.mlp = SwiGLU(D, config.d_ff, bias=config.mlp_bias)

    def forward(self, x, key_padding_mask=None, cache=None):
        h = x + self.self_attn(self.input_layernorm(x), key_padding_mask=key_padding_mask, causal=True, cache=cache)
        return h + self.mlp(self.post_attention_layernorm(h))

    def backward(self, dy):
        """dy (B, L, D) -> dx (B, L, D)."""
        # y = h + mlp(norm_2(h))  =>  dh = dy (the residual) + the path through the feed-forward
        dh = dy + self.post_attention_layernorm.backward(self.mlp.backward(dy))
        # h = x + attn(norm_1(x))  =>  dx = dh + the path through the attention
        return dh + self.input_layernorm.backward(self.self_attn.backward(dh))


class Llama(Module):
    """Decoder-only Llama-family model: ``model(ids)`` takes token ids (B, L) and returns next-token logits
    (B, L, V); position t sees tokens 0..t only (and not those ``key_padding_mask`` marks, True = padding).

    Parts: ``embed_tokens`` (no scale, no added positions: rotary turns q and k inside each attention),
    ``layers`` (:class:`LlamaBlock`), ``norm`` (the final RMSNorm), ``lm_head`` (an :class:`OutputProjection`
    whose weight is ``embed_tokens.weight`` when ``config.tie_word_embeddings``). ``config`` is the
    :class:`LlamaConfig` it was built from. The next-token loss is
    ``LabelSmoothedCrossEntropy(0.0, ignore_index=-1)(model(ids[:, :-1]), ids[:, 1:])``.
    """

    def __init__(self, config):
        if not isinstance(config, LlamaConfig):
            raise ValueError(f"Llama is built from a LlamaConfig, got {type(config).__name__}")
        self.config = config
        self.vocab_size = config.vocab_size
        self.embed_tokens = Embedding(config.vocab_size, config.d_model, scale=False)
        self.layers = ModuleList([LlamaBlock(config, i) for i in range(config.num_layers)])
        self.norm = RMSNorm(config.d_model, config.rms_norm_eps)
        self.lm_head = OutputProjection(self.embed_tokens.weight if config.tie_word_embeddings
                                        else Embedding(config.vocab_size, config.d_model).weight)
        self.init_normal(config.initializer_range)

    @classmethod
    def from_config(cls, config=None, **fields):
        """The model of a :class:`LlamaConfig` (or its fields as keywords)."""
        return cls(config.replace(**fields) if config is not None else LlamaConfig(**fields))

    def init_normal(self, std):
        """Every matrix ~ N(0, std^2), biases 0, RMSNorm gains 1 (Hugging Face's ``_init_weights``)."""
        rng = backend.init_rng()
        for p in self.parameters():
            if p.data.ndim >= 2:  # matrices, and the experts' stacked ones
                p.data[...] = backend.asarray(rng.normal(0.0, std, p.shape), dtype=p.data.dtype)

    @property
    def position_limit(self):
        """The positions the model was made for (max_position_embeddings, or a shorter sliding_window:
        ``LlamaConfig.positions``): the generators refuse to go beyond."""
        return self.config.positions[0]

    # -- forward / backward ---------------------------------------------------------
    def forward(self, ids, key_padding_mask=None, cache=None, start=None):
        """ids (B, L) integer array -> logits (B, L, V). ``key_padding_mask`` (B, L) bool, True = padding (the
        inverse of Hugging Face's attention_mask); positions are 0..L-1 in every row. With ``cache`` (a dict,
        no_grad only) ``ids`` holds the new positions only: the keys and values of the earlier ones come from the
        cache, and the new ones are at the positions after them (``start``, if given, must be that number;
        ``key_padding_mask`` then covers the cached positions and these)."""
        ids = check_ids(ids, "ids", self.vocab_size)
        if cache is not None:
            states = cache.setdefault("layers", [{} for _ in self.layers])
            cached = states[0].get("length", 0)
            if start is not None and start != cached:
                raise ValueError(f"start {start} is not the cache's length {cached}: the new tokens go right after "
                                 "the cached ones")
        elif start:
            raise ValueError("start is for decoding with a cache (the positions of the cached tokens come first)")
        window, length = self.config.sliding_window, ids.shape[1] + (cached if cache is not None else 0)
        if window is not None and length > window:  # full attention is the window's exactly up to W positions
            raise ValueError(f"{length} positions are beyond the model's sliding_window {window}, over which minitf's "
                             f"full attention is exact; give at most {window}")
        # the rows the auxiliary losses count: every token, or the real ones (transformers' attention mask; with a
        # cache the mask covers the cached positions too, and only the new ones are routed: every new row counts)
        self.aux_rows = None if key_padding_mask is None or cache is not None else \
            ~backend.asarray(key_padding_mask).reshape(-1)                # (B*L,) True = a real token
        x = self.embed_tokens(ids)                                      # W[ids]  (B, L, D)
        for i, layer in enumerate(self.layers):
            x = layer(x, key_padding_mask, None if cache is None else states[i])  # N pre-norm blocks
        return self.lm_head(self.norm(x))                               # logits = rmsnorm(h) W^T  (B, L, V)

    def backward(self, dlogits):
        """dlogits (B, L, V) -> fills ``p.grad`` of every parameter (accumulating)."""
        dx = self.norm.backward(self.lm_head.backward(dlogits))         # logits = norm(h) W^T
        for layer in reversed(list(self.layers)):
            dx = layer.backward(dx)
        self.embed_tokens.backward(dx)                                  # tied: adds into lm_head's dW

    # -- mixtures of experts: the auxiliary losses ---------------------------------
    def sparse_blocks(self):
        """The :class:`minitf.moe.SparseMoE` feed-forwards, in layer order (none in a dense model)."""
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, SparseMoE)]

    def aux_losses(self):
        """``{name: (value, coefficient)}`` of the last forward's auxiliary losses ({} in a dense model):
        "load_balancing" (transformers' ``load_balancing_loss_func`` over every sparse layer's rows, padding left
        out) with ``router_aux_loss_coef``, and "router_z" with ``router_z_loss_coef`` where that is above 0. The
        training loss is ``main + sum coefficient * value``; each value is logged apart."""
        return aux_losses(self.sparse_blocks(), self.aux_coefficients(), getattr(self, "aux_rows", None))

    def aux_coefficients(self):
        """``{name: coefficient}`` of the auxiliary losses :meth:`aux_losses` reports ({} in a dense model):
        "load_balancing" with ``router_aux_loss_coef``, "router_z" with ``router_z_loss_coef`` where above 0."""
        c = self.config
        if not self.sparse_blocks():
            return {}
        return {"load_balancing": c.router_aux_loss_coef} | (
            {"router_z": c.router_z_loss_coef} if c.router_z_loss_coef > 0 else {})

    def backward_aux(self, weights):
        """Add the gradient of ``sum_name weights[name] * aux_losses()[name] value`` (weights: usually
        coefficient x the loss scale the main loss's gradient carries). Call it after the forward and BEFORE
        :meth:`backward`: it parks each sparse layer's router-logit gradient, which backward then carries into the
        routers and, through the residual stream, every parameter below (an auxiliary loss depends on them all).
        ``backward(dlogits)`` alone stays the gradient of what dlogits is the gradient of."""
        backward_aux(self.sparse_blocks(), weights, getattr(self, "aux_rows", None))

    def expert_load(self):
        """Tokens per expert of the last forward, one host array (E,) per sparse layer (padding counted)."""
        return [block.load() for block in self.sparse_blocks()]

    # -- Hugging Face folders -------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder, dtype=None, warn=None):
        """The model of a Hugging Face Llama, Qwen2, Mistral, Qwen3, Qwen3-MoE, Qwen2-MoE, Mixtral or OLMoE folder
        (:func:`minitf.llama.moe_hf.from_pretrained`): config.json and every tensor checked first, bfloat16 and
        float16 weights widened, built under ``dtype``; ``warn(message)`` hears what is applied as transformers
        applies it though the folder contradicts itself."""
        return moe_hf.from_pretrained(cls, folder, dtype, warn)

    def save_pretrained(self, folder, hf_config=None):
        """Write this model as a Hugging Face folder (:func:`minitf.llama.moe_hf.save_pretrained`; ``hf_config``:
        the config.json it was read from, whose other entries are kept) that transformers loads with the same
        logits."""
        moe_hf.save_pretrained(self, folder, hf_config)

    def num_parameters_of_shape(self):
        """The parameters a model of this config has, counted from the config alone."""
        c = self.config
        D, E, F = c.d_model, c.head_size, c.d_ff
        attn = D * E * (c.num_heads * 2 + c.num_kv_heads * 2)                 # q and o; k and v
        attn += c.attention_bias * E * (c.num_heads + 2 * c.num_kv_heads)     # q, k, v biases
        attn += {None: 0, "head": 2 * E, "projection": E * (c.num_heads + c.num_kv_heads)}[c.qk_norm]
        dense = 3 * D * F + c.mlp_bias * (2 * F + D)
        sparse = D * c.num_experts + 3 * D * c.expert_d_ff * c.num_experts    # router; experts
        sparse += (3 * D * c.shared_expert_d_ff + D) if c.shared_expert_d_ff else 0  # shared expert and its gate
        blocks = sum(attn + 2 * D + (sparse if c.is_sparse(i) else dense) for i in range(c.num_layers))
        return c.vocab_size * D * (1 if c.tie_word_embeddings else 2) + blocks + D

