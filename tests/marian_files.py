"""Tokenizer files of a Marian folder made inside a test (no download): two tiny sentencepiece models trained
here on a few hundred words (unigram, as opus-mt's), and a vocab.json as opus-mt's are laid out (``</s>`` 0,
``<unk>`` 1, language codes, the pieces of both models in a shuffled order, ``<pad>`` last), so that a
vocabulary id is mostly not the sentencepiece id of its piece; a few pieces are left out of it (they become
``<unk>``). And a whole Marian folder (:func:`make_marian_folder`: a random ``transformers.MarianMTModel``
saved beside them with an opus-mt generation_config.json). Used by tests/test_marian_tokenizer.py,
tests/test_marian_generate.py and tests/test_translate.py."""
import io
import json
import pathlib
import random

SOURCE_WORDS = ("Ich habe Hunger . Der Hund läuft schnell nach Hause , und die Katze schläft ! Wir essen "
                "3 Äpfel am 12. Mai ? Was ist das Straße Brücke Mädchen über 2024 Euro sehr gut heute").split()
TARGET_WORDS = ("I am hungry . The dog runs quickly home , and the cat sleeps ! We eat 3 apples on 12 May ? "
                "What is that street bridge girl over 2024 euros very good today").split()
CODES = (">>deu<<", ">>fra<<")


def _train(words, rng, vocab_size):
    import sentencepiece

    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="unigram", vocab_size=vocab_size,
        character_coverage=1.0, num_threads=1, minloglevel=2)
    return model.getvalue()


def _vocab(models, rng, codes, drop, missing=()):
    import sentencepiece

    pieces = []
    for data in models:
        processor = sentencepiece.SentencePieceProcessor(model_proto=data)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not (processor.is_control(i) or processor.is_unknown(i)) and piece not in pieces:
                pieces.append(piece)
    rng.shuffle(pieces)
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in list(codes) + pieces[drop:]:  # the first `drop` shuffled pieces are not in the vocabulary
        if piece not in missing:
            vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def write_tokenizer_files(folder, seed=0, spm_size=60, separate=False, codes=CODES, drop=4, source_words=SOURCE_WORDS,
                          missing=()):
    """Write source.spm, target.spm, vocab.json (and target_vocab.json with ``separate``) and
    tokenizer_config.json into ``folder``; returns the vocabulary size (the <pad> id + 1; with
    ``separate``, both vocabularies have that size). ``source_words``: what the source model is trained on;
    ``missing``: pieces left out of the vocabularies (besides the ``drop`` first shuffled ones)."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    source, target = _train(source_words, rng, spm_size), _train(TARGET_WORDS, rng, spm_size)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    config = {"source_lang": "de", "target_lang": "en"}
    if separate:
        vocab, target_vocab = _vocab([source], rng, codes, drop, missing), _vocab([target], rng, (), drop, missing)
        # equal sizes, <pad> the same id, as Marian's converter makes them (a longer one loses pieces)
        size = min(len(vocab), len(target_vocab))
        vocab, target_vocab = ({piece: i for piece, i in v.items() if i < size - 1} | {"<pad>": size - 1}
                               for v in (vocab, target_vocab))
        (folder / "target_vocab.json").write_text(json.dumps(target_vocab, ensure_ascii=False), encoding="utf-8")
        config["separate_vocabs"] = True
    else:
        vocab = _vocab([source, target], rng, codes, drop, missing)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return len(vocab)


MAX_LENGTH = 16  # generate's max_length: the start token and at most 15 more, the last a forced eos


def generation_config(pad, **changes):
    """An opus-mt generation_config.json (the converter's template) with ``changes``."""
    return {"bad_words_ids": [[pad]], "bos_token_id": 0, "decoder_start_token_id": pad, "eos_token_id": 0,
            "forced_eos_token_id": 0, "max_length": MAX_LENGTH, "num_beams": 4, "pad_token_id": pad,
            "renormalize_logits": True} | changes


def minitf_marian_folder(folder, seed=3, **tokenizer_files):
    """A random Marian-shaped minitf.Transformer (2+2 layers, d_model 16, SiLU, halves positions, an output bias,
    pad as the decoder's start, eos 0) saved by minitf's own writer into ``folder`` with tokenizer files trained
    here (``tokenizer_files``: :func:`write_tokenizer_files`'s options); returns the model. No torch needed."""
    import minitf
    from minitf.nmt import marian
    V = write_tokenizer_files(folder, **tokenizer_files)
    minitf.manual_seed(seed)
    model = minitf.Transformer(V, V, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=32,
                               dropout=0.0, pad_id=V - 1, activation="silu", positions="halves", output_bias=True,
                               mask_target_padding=False, freeze_pad_embedding=True, decoder_start_id=V - 1, eos_id=0)
    marian.save_pretrained(model, folder)
    return model


def make_marian_folder(folder, seed=0, eos_bias=1.0, pad_bias=2.0, scale=0.3, d_model=16, layers=2, **generation):
    """A random MarianMTModel (2+2 layers, d_model 16, swish, scaled embeddings, a zero pad row, non-zero
    final_logits_bias) saved into ``folder`` with tokenizer files and generation_config.json; returns the folder.
    The defaults (seed 0, found by trying a few): the eos's bias raised by ``eos_bias`` so that hypotheses
    finish at many lengths (the stopping rules matter), the pad's by ``pad_bias`` so that banning it without
    renormalizing would change the scores."""
    import torch
    import transformers

    V = write_tokenizer_files(folder, seed=seed)
    torch.manual_seed(seed)
    config = transformers.MarianConfig(
        vocab_size=V, d_model=d_model, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
        max_position_embeddings=64, activation_function="swish", scale_embedding=True, pad_token_id=V - 1,
        decoder_start_token_id=V - 1, eos_token_id=0, forced_eos_token_id=0, bos_token_id=0, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" not in name:  # weights ~ N(0, scale^2), biases ~ N(0, 0.01): no one token wins always
                p.normal_(0.0, scale if "bias" not in name else 0.1)
        model.model.shared.weight[V - 1] = 0  # as in converted opus-mt models
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[0, 0] += eos_bias
        model.final_logits_bias[0, V - 1] += pad_bias  # a likely pad: banning it changes the other log-probs
    model.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(generation_config(V - 1, **generation)))
    return folder


def sentences(n=15, seed=1):
    """``n`` source sentences of 2 to 10 words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(SOURCE_WORDS) for _ in range(rng.randint(2, 10))) for _ in range(n)]
