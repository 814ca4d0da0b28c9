"""The layers of ``python -m minitf.gradcheck LAYER``: for each name, a small random instance
of the library's layer, its inputs, and what forward and backward to compare.

One function per layer, registered under its name with ``@layer("name")``; it takes the
random generator and returns ``(forward, backward, inputs, module)``: ``inputs`` a dict
name -> array (the float ones are checked), ``module`` the Module whose parameters are checked
(None for a layer without parameters). The order of the functions is the order of ``--help``.
A new elementwise activation is one line (see :func:`elementwise`)::

    @layer("relu")
    def _relu(rng):
        return elementwise(minitf.ReLU(), rng)
"""
import minitf
from minitf import backend
from minitf.attention import attention_keep_mask
from minitf.draws import random_array, randomize
from minitf.moe import SparseMoE

#: name -> build(rng) -> (forward, backward, inputs, module), in the order of ``--help``
BUILDERS = {}

#: the sizes of every instance: batch, source and target length, width, heads, FFN width, vocabulary
B, S, T, D, H, F, V = 2, 4, 3, 4, 2, 6, 7


def layer(name):
    """Register the decorated ``build(rng)`` as the layer ``name`` of the command."""
    def register(build):
        if name in BUILDERS:
            raise ValueError(f"two layers named {name!r}")
        BUILDERS[name] = build
        return build
    return register


def build(name, rng):
    """A small random instance of the layer ``name``: (forward, backward, inputs, module)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown layer {name!r}")
    return BUILDERS[name](rng)


def source_padding():
    """(B, S) True = padding: row 0 has none, row 1 pads its last position."""
    return backend.asarray(backend.host.arange(S)[None, :] >= backend.host.array([[S], [S - 1]]))


def elementwise(module, rng, scale=1.0):
    """An elementwise layer without parameters on one (B, T, D) input of N(0, scale^2) values."""
    return module.forward, module.backward, {"x": random_array(rng, (B, T, D), scale)}, None


@layer("linear")
def _linear(rng):
    m = randomize(minitf.Linear(D, F), rng)
    return m.forward, m.backward, {"x": random_array(rng, (B, T, D))}, m


@layer("embedding")
def _embedding(rng):
    m = minitf.Embedding(V, D)
    ids = backend.asarray(rng.integers(0, V, (B, T)))
    return (lambda: m.forward(ids)), m.backward, {}, m


@layer("positional")
def _positional(rng):
    return elementwise(minitf.PositionalEncoding(D), rng)


@layer("dropout")
def _dropout(rng):
    return elementwise(minitf.Dropout(0.3), rng)


@layer("layernorm")
def _layernorm(rng):
    m = randomize(minitf.LayerNorm(D), rng)
    return m.forward, m.backward, {"x": random_array(rng, (B, T, D))}, m


@layer("relu")
def _relu(rng):
    return elementwise(minitf.ReLU(), rng)


@layer("softmax")
def _softmax(rng):
    return elementwise(minitf.Softmax(), rng, scale=3.0)


@layer("attention")
def _attention(rng):
    Q, K, U = random_array(rng, (B, H, T, D)), random_array(rng, (B, H, S, D)), random_array(rng, (B, H, S, D))
    keep = attention_keep_mask(source_padding(), False, T, S)
    saved = {}

    def forward(Q, K, U):
        O, saved["P"] = minitf.scaled_dot_product_attention(Q, K, U, keep)
        return O
    return forward, (lambda dO: minitf.scaled_dot_product_attention_backward(dO, Q, K, U, saved["P"])), \
        {"Q": Q, "K": K, "U": U}, None


@layer("mha")
def _self_attention(rng):
    m = randomize(minitf.MultiHeadAttention(D, H), rng)
    return (lambda x: m.forward(x, causal=True)), (lambda dy: m.backward(dy)[0]), {"x": random_array(rng, (B, T, D))}, m


@layer("cross")
def _cross_attention(rng):
    m = randomize(minitf.MultiHeadAttention(D, H), rng)
    src_pad = source_padding()
    return (lambda x, mem: m.forward(x, mem, key_padding_mask=src_pad)), m.backward, \
        {"x": random_array(rng, (B, T, D)), "memory": random_array(rng, (B, S, D))}, m


@layer("feedforward")
def _feedforward(rng):
    m = randomize(minitf.FeedForward(D, F), rng)
    return m.forward, m.backward, {"x": random_array(rng, (B, T, D))}, m


def _encoder(m, rng):
    src_pad = source_padding()
    return (lambda x: m.forward(x, src_pad)), m.backward, {"x": random_array(rng, (B, S, D))}, m


def _decoder(m, rng):
    src_pad = source_padding()
    return (lambda y, mem: m.forward(y, mem, src_pad)), m.backward, \
        {"y": random_array(rng, (B, T, D)), "memory": random_array(rng, (B, S, D))}, m


@layer("encoder_layer")
def _encoder_layer(rng):
    return _encoder(randomize(minitf.EncoderLayer(D, H, F, dropout=0.0), rng), rng)


@layer("decoder_layer")
def _decoder_layer(rng):
    return _decoder(randomize(minitf.DecoderLayer(D, H, F, dropout=0.0), rng), rng)


@layer("encoder")
def _encoder_stack(rng):
    return _encoder(randomize(minitf.Encoder(2, D, H, F, dropout=0.0), rng), rng)


@layer("decoder")
def _decoder_stack(rng):
    return _decoder(randomize(minitf.Decoder(2, D, H, F, dropout=0.0), rng), rng)


@layer("loss")
def _loss(rng):
    m = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=0)
    target = backend.asarray(rng.integers(0, V, (B, T)))
    return (lambda z: backend.asarray(m.forward(z, target))), (lambda g: m.backward(float(g))), \
        {"logits": random_array(rng, (B, T, V), 2.0)}, None


@layer("model")
def _model(rng):
    m = randomize(minitf.Transformer(V, V, d_model=D, num_heads=H, num_encoder_layers=2, num_decoder_layers=2,
                                     d_ff=F, dropout=0.0), rng)
    loss = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=0)
    src, tgt = rng.integers(1, V, (B, S)), rng.integers(1, V, (B, T + 1))
    src[1, -1] = 0
    return (lambda: backend.asarray(loss(m(src, tgt[:, :-1]), tgt[:, 1:]))), \
        (lambda g: m.backward(loss.backward(float(g)))), {}, m


@layer("gelu")
def _gelu(rng):
    return elementwise(minitf.GELU("none"), rng, scale=2.0)


@layer("gelu_tanh")
def _gelu_tanh(rng):
    return elementwise(minitf.GELU("tanh"), rng, scale=2.0)


@layer("learned_positions")
def _learned_positions(rng):
    m = randomize(minitf.LearnedPositionalEmbedding(T + 2, D), rng)
    return (lambda x: m.forward(x, start=1)), m.backward, {"x": random_array(rng, (B, T, D))}, m


@layer("gpt")
def _gpt(rng):  # GPT-2's shape, with the next-token loss: position t predicts token t + 1
    m = randomize(minitf.GPT(V, max_len=T, d_model=D, num_heads=H, num_layers=2, d_ff=F, dropout=0.0), rng)
    loss = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    ids = rng.integers(0, V, (B, T + 1))
    return (lambda: backend.asarray(loss(m(ids[:, :-1]), ids[:, 1:]))), \
        (lambda g: m.backward(loss.backward(float(g)))), {}, m


@layer("silu")
def _silu(rng):  # Marian's activation (Hugging Face's "swish")
    return elementwise(minitf.layers.SiLU(), rng, scale=2.0)


@layer("marian")
def _marian(rng):
    """The Transformer with Marian's options (opus-mt's shape, minitf.nmt.marian.from_pretrained): SiLU, [sin | cos]
    halves, an output bias, no target-padding mask, pad = the last id and the decoder's start token. Not its
    frozen pad row (freeze_pad_embedding): that is on purpose not the function's gradient (tests/test_layers.py)."""
    pad = V - 1
    m = randomize(minitf.Transformer(V, V, d_model=D, num_heads=H, num_encoder_layers=2, num_decoder_layers=2,
                                     d_ff=F, dropout=0.0, pad_id=pad, activation="silu", positions="halves",
                                     output_bias=True, mask_target_padding=False, decoder_start_id=pad, eos_id=0),
                  rng)
    loss = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=pad)
    src, labels = rng.integers(0, pad, (B, S)), rng.integers(0, pad, (B, T))
    src[1, -1], labels[1, -1] = pad, pad                       # padding in both
    tgt_in = backend.host.concatenate([backend.host.full((B, 1), pad), labels[:, :-1]], axis=1)  # starts from pad
    return (lambda: backend.asarray(loss(m(src, tgt_in), labels))), \
        (lambda g: m.backward(loss.backward(float(g)))), {}, m


@layer("rmsnorm")
def _rmsnorm(rng):  # the Llama family's norm: no mean, no beta
    m = randomize(minitf.RMSNorm(D), rng)
    return m.forward, m.backward, {"x": random_array(rng, (B, T, D))}, m


@layer("rotary")
def _rotary(rng):  # queries or keys (B, T, heads, dk) turned by position; start 1: a cached decoding step's offset
    m = minitf.RotaryEmbedding(D, theta=100.0)
    return (lambda x: m.forward(x, start=1)), m.backward, {"x": random_array(rng, (B, T, H, D))}, None


@layer("swiglu")
def _swiglu(rng):  # down(silu(gate(x)) * up(x))
    m = randomize(minitf.SwiGLU(D, F), rng)
    return m.forward, m.backward, {"x": random_array(rng, (B, T, D))}, m


@layer("gqa")
def _grouped_query_attention(rng):  # 4 query heads share 2 key/value heads; rotary positions, q/k/v biases
    m = randomize(minitf.GroupedQueryAttention(2 * D, 4, num_kv_heads=2, qkv_bias=True,
                                               rotary=minitf.RotaryEmbedding(D // 2)), rng)
    pad = backend.asarray(backend.host.arange(T)[None, :] >= backend.host.array([[T], [T - 1]]))
    return (lambda x: m.forward(x, key_padding_mask=pad)), m.backward, {"x": random_array(rng, (B, T, 2 * D))}, m


@layer("moe")
def _sparse_moe(rng):  # 5 SwiGLU experts, each token through its top 2 (renormalised), a shared expert
    # the routers' values are spread wide (scale 2): a central difference of 1e-6 never flips a top-2 choice
    m = randomize(SparseMoE(D, F, 5, 2, shared_d_ff=3), rng, scale=2.0)
    return m.forward, m.backward, {"x": random_array(rng, (B, T, D))}, m


#: the layers of the command, in the order of ``--help`` (a new layer's function goes above this line)
LAYERS = list(BUILDERS)
