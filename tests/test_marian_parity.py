"""minitf's Transformer against Hugging Face's Marian (``transformers.MarianMTModel``, the opus-mt models):
a small MarianMTModel with random weights, made here (no download), saved with ``save_pretrained`` and
read by ``minitf.nmt.marian.from_pretrained``, gives the same logits, loss and gradient of every
parameter as PyTorch's autograd, in float64, on a batch with padding on both sides; a folder holding only
``pytorch_model.bin`` reads the same through torch's weights-only loader; and what ``save_pretrained``
writes loads in transformers with the same logits.

Tolerance: relative difference below 1e-10 (the largest difference over the largest entry), as in
tests/test_gpt2_parity.py: the same function in float64 in another order agrees to ~1e-15; a wrong layout,
mask, activation or bias is O(1) off. One thing is set equal first: transformers stores its sinusoid table
rounded to float32 even in a float64 model (``torch.FloatTensor`` in ``create_weight``), minitf computes it
in the model's dtype; both models are given the exact float64 table, and the float32 tables are compared
on their own (equal to the bit). Skipped where torch and transformers (the ``bench`` extra) are missing."""
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

REASON = 'needs the bench extra (torch, transformers, safetensors): pip install -e ".[bench]"'
torch = pytest.importorskip("torch", reason=REASON)
transformers = pytest.importorskip("transformers", reason=REASON)
pytest.importorskip("safetensors", reason=REASON)

import minitf  # noqa: E402
from minitf import backend  # noqa: E402
from minitf.nmt import marian  # noqa: E402
from minitf.layers import sinusoidal_table  # noqa: E402
from minitf.testing import seeds  # noqa: E402
from tests.helpers import relative_difference  # noqa: E402

np = backend.host
RTOL = 1e-10

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("safetensors", "bench")]


def marian_config(**config):
    """An opus-mt-shaped MarianConfig at a test's size (opus-mt: swish, scaled embeddings, pad = decoder
    start = the last id, eos 0), without dropout."""
    V = config.pop("vocab_size", 100)
    config = dict(vocab_size=V, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                  activation_function="swish", scale_embedding=True, pad_token_id=V - 1,
                  decoder_start_token_id=V - 1, eos_token_id=0, forced_eos_token_id=0, dropout=0.0) | config
    return transformers.MarianConfig(**config)


def hf_marian(seed, **config):
    """A random float32 MarianMTModel (eval mode) with random LayerNorm gains, biases and final_logits_bias
    too (transformers leaves them at 1, 0 and 0), so that every term of every gradient counts."""
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(marian_config(**config))
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.normal_(0.0, 0.5)
    return model.eval()


def in_float64(hf):
    """``hf`` in float64 with the exact sinusoid table (the module doc: transformers rounds it to float32)."""
    hf = hf.double()
    with torch.no_grad():
        for side in (hf.model.encoder, hf.model.decoder):
            P, D = side.embed_positions.weight.shape
            table = sinusoidal_table(P, D, dtype=np.float64, layout="halves")  # on minitf's device: to the host
            side.embed_positions.weight.copy_(torch.from_numpy(backend.to_numpy(table)))
    return hf


def padded_batch(seed, src_vocab, tgt_vocab, pad, eos=0, B=3, S=6, T=5):
    """src (B, S) ending in eos then pad, labels (B, T) ending in eos then pad, and the decoder's input
    (B, T): labels shifted right behind the start token (pad), as transformers' shift_tokens_right."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, src_vocab - 1, (B, S))
    labels = rng.integers(1, tgt_vocab - 1, (B, T))
    for row in range(B):  # the first row is full; the others end early
        n, m = (S, T) if row == 0 else (rng.integers(1, S), rng.integers(1, T))
        src[row, n - 1], src[row, n:] = eos, pad
        labels[row, m - 1], labels[row, m:] = eos, pad
    tgt_in = np.concatenate([np.full((B, 1), pad), labels[:, :-1]], axis=1)
    return src, labels, tgt_in


@st.composite
def configs(draw):
    share = draw(st.booleans())
    V = draw(st.integers(60, 120))
    config = dict(vocab_size=V, d_model=draw(st.sampled_from([16, 24, 32])),
                  encoder_layers=draw(st.integers(1, 2)), decoder_layers=draw(st.integers(1, 2)),
                  activation_function=draw(st.sampled_from(["swish", "silu", "relu", "gelu", "gelu_new"])),
                  scale_embedding=draw(st.booleans()), share_encoder_decoder_embeddings=share)
    if not share:  # separate vocabularies; the decoder's pad (its start) is the last id of the smaller one
        config["decoder_vocab_size"] = draw(st.integers(60, 120))
        config["pad_token_id"] = config["decoder_start_token_id"] = min(V, config["decoder_vocab_size"]) - 1
        config["tie_word_embeddings"] = draw(st.booleans())  # the output tied to the decoder's embedding, or not
    return config


#: every kind of model at least once, whatever hypothesis draws: opus-mt's, and separate vocabularies with the
#: output projection tied to the target embedding and untied
SEPARATE = dict(vocab_size=90, d_model=16, encoder_layers=2, decoder_layers=1, activation_function="swish",
                scale_embedding=True, share_encoder_decoder_embeddings=False, decoder_vocab_size=70,
                pad_token_id=69, decoder_start_token_id=69)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configs(), seed=seeds)
@example(config=dict(vocab_size=100, d_model=32), seed=0)
@example(config=SEPARATE | {"tie_word_embeddings": True}, seed=1)
@example(config=SEPARATE | {"tie_word_embeddings": False}, seed=2)
def test_logits_loss_and_every_gradient_equal_hugging_face_marian(config, seed, tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian")
    hf = hf_marian(seed % 2**31, **config)
    hf.save_pretrained(folder)
    hf = in_float64(hf)
    model = marian.from_pretrained(folder)
    c = hf.config
    assert model.src_embed.weight.data.dtype == np.float64
    assert model.config.positions == "halves" and model.config.output_bias
    assert model.config.activation == marian.HF_ACTIVATIONS[c.activation_function]
    assert model.config.share_embeddings == c.share_encoder_decoder_embeddings
    assert (model.generator.weight is model.tgt_embed.weight) == c.tie_word_embeddings
    pad = c.pad_token_id
    src, labels, tgt_in = padded_batch(seed, c.vocab_size, c.decoder_vocab_size, pad)

    model.zero_grad()
    logits = model(src, tgt_in)
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=pad)  # pads (never a real label) left out
    loss = loss_fn(logits, labels)
    model.backward(loss_fn.backward())

    hf.final_logits_bias.requires_grad_(True)  # a buffer in transformers: its gradient is compared too
    out = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != pad),
             labels=torch.from_numpy(np.where(labels == pad, -100, labels)))  # -100: ignored; shifted in as pad
    out.loss.backward()
    assert relative_difference(backend.to_numpy(logits), out.logits.detach().numpy()) < RTOL
    # transformers' loss is CrossEntropyLoss's mean over the labels that are not -100: minitf's mean over non-pads
    assert abs(loss - out.loss.item()) <= RTOL * abs(out.loss.item())

    theirs = {name: p.grad.numpy() for name, p in hf.named_parameters() if p.requires_grad}
    theirs["final_logits_bias"] = hf.final_logits_bias.grad.numpy()
    theirs = marian.hf_to_minitf_state(theirs, model.config)  # the same transposes and concatenations
    ours = {name: backend.to_numpy(p.grad) for name, p in model.named_parameters()}
    assert set(ours) == set(theirs)
    largest = max(float(np.abs(g).max()) for g in theirs.values())
    for name in ours:
        # a floor of 1e-3 of the largest gradient: the key bias's gradient is 0 in exact arithmetic
        # (softmax ignores a constant added to a row), rounding noise on both sides
        assert relative_difference(ours[name], theirs[name], floor=1e-3 * largest) < RTOL, name
    # the tied embedding's gradient is the sum of its uses: source, target and output (or target and output)
    assert float(np.abs(ours["src_embed.weight"]).max()) > 0


def test_the_sinusoid_tables_are_equal_to_the_bit_in_float32():
    hf = hf_marian(0, max_position_embeddings=512, d_model=32)
    theirs = hf.model.encoder.embed_positions.weight.detach().numpy()  # transformers' float32 table
    ours = backend.to_numpy(sinusoidal_table(512, 32, dtype=np.float32, layout="halves"))
    assert np.array_equal(ours, theirs)
    assert np.abs(backend.to_numpy(sinusoidal_table(512, 32, dtype=np.float32)) - theirs).max() > 0.5  # interleaved


def logits_of(hf, src, tgt_in, pad):
    with torch.no_grad():
        return hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != pad),
                  decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()


def test_a_folder_with_only_pytorch_model_bin_reads_through_weights_only(tmp_path):
    """An older folder: torch.save of the whole state dict, with the tied aliases and the position tables."""
    hf = in_float64(hf_marian(1))
    hf.config.save_pretrained(tmp_path)
    state = hf.state_dict()
    assert {"lm_head.weight", "model.encoder.embed_positions.weight"} <= set(state)
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = marian.from_pretrained(tmp_path)
    src, _, tgt_in = padded_batch(1, 100, 100, 99)
    with minitf.no_grad():
        ours = backend.to_numpy(model(src, tgt_in))
    assert relative_difference(ours, logits_of(hf, src, tgt_in, 99)) < RTOL


def test_save_pretrained_writes_what_transformers_writes_and_loads_with_the_same_logits(tmp_path):
    first, second = tmp_path / "hf", tmp_path / "minitf"
    hf = hf_marian(2)
    hf.save_pretrained(first)
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):  # as the tokenizer would
        (first / name).write_bytes(f"the {name} file".encode())
    model, hf_config = marian.read(first, dtype="float32")
    marian.save_pretrained(model, second, hf_config, source=first)

    safetensors = pytest.importorskip("safetensors.numpy")
    written, original = safetensors.load_file(str(second / "model.safetensors")), \
        safetensors.load_file(str(first / "model.safetensors"))
    assert set(written) == set(original) and len(written) == 86  # no aliases, no position tables
    assert all(np.array_equal(written[name], original[name]) for name in original)  # float32, bit for bit
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json", "generation_config.json"):
        assert (second / name).read_bytes() == (first / name).read_bytes(), name

    back = in_float64(transformers.MarianMTModel.from_pretrained(second).eval())
    src, _, tgt_in = padded_batch(2, 100, 100, 99)
    with backend.default_dtype("float64"):
        model64 = marian.from_pretrained(second)
    with minitf.no_grad():
        ours = backend.to_numpy(model64(src, tgt_in))
    assert relative_difference(ours, logits_of(back, src, tgt_in, 99)) < RTOL
    assert back.config.decoder_start_token_id == 99 and back.config.activation_function == "swish"


def test_a_paper_model_is_written_exactly_with_its_interleaved_sinusoids_permuted_to_halves(tmp_path):
    """minitf's own model (ReLU, interleaved positions, no output bias, BOS start) is written by renaming
    the model axis: transformers computes the same logits. Rows whose decoder input is pad are left out:
    minitf masks target padding there (the paper's model), transformers does not; no loss and no decoding
    reads them."""
    backend.manual_seed(4)
    model = minitf.Transformer(50, 50, d_model=12, num_heads=3, num_encoder_layers=2, num_decoder_layers=1,
                               d_ff=20, dropout=0.0).eval()
    for p in model.parameters():  # every parameter random, gains and biases too
        p.data[...] = backend.asarray(np.random.default_rng(p.size).normal(0, 0.5, p.shape))
    marian.save_pretrained(model, tmp_path, decoder_start_id=2, eos_id=3)
    hf = in_float64(transformers.MarianMTModel.from_pretrained(tmp_path).eval())
    assert hf.config.activation_function == "relu" and hf.config.decoder_start_token_id == 2
    src, labels, tgt_in = padded_batch(4, 50, 50, pad=0, eos=3)
    tgt_in[:, 0] = 2  # minitf's BOS starts the decoder
    with minitf.no_grad():
        ours = backend.to_numpy(model(src, tgt_in))
    theirs = logits_of(hf, src, tgt_in, 0)
    real = tgt_in != 0
    assert relative_difference(ours[real], theirs[real]) < RTOL
    read = marian.from_pretrained(tmp_path)  # and read back: now in Marian's layout
    with minitf.no_grad():
        again = backend.to_numpy(read(src, tgt_in))
    assert read.config.positions == "halves" and relative_difference(again, theirs) < RTOL


@pytest.mark.parametrize("tied", [True, False])
def test_separate_vocabularies_are_written_back_as_transformers_reads_them(tied, tmp_path):
    first, second = tmp_path / "hf", tmp_path / "minitf"
    hf_marian(3, **SEPARATE, tie_word_embeddings=tied).save_pretrained(first)
    model, hf_config = marian.read(first)
    marian.save_pretrained(model, second, hf_config, source=first)
    back = in_float64(transformers.MarianMTModel.from_pretrained(second).eval())
    assert (back.lm_head.weight is back.model.decoder.embed_tokens.weight) == tied
    model = marian.from_pretrained(second)
    src, _, tgt_in = padded_batch(3, 90, 70, 69)
    with minitf.no_grad():
        ours = backend.to_numpy(model(src, tgt_in))
    assert relative_difference(ours, logits_of(back, src, tgt_in, 69)) < RTOL
