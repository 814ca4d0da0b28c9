"""Tokenizer files of a Marian folder made inside a test (no download): two tiny sentencepiece models trained
here on a few hundred words (unigram, as opus-mt's), and a vocab.json as opus-mt's are laid out (``</s>`` 0,
``<unk>`` 1, language codes, the pieces of both models in a shuffled order, ``<pad>`` last), so that a
vocabulary id is never the sentencepiece id of its piece; a few pieces are left out of it (they become
``<unk>``). Used by tests/test_marian_tokenizer.py, tests/test_marian_generate.py and tests/test_translate.py."""
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


def _vocab(models, rng, codes, drop):
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
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def write_tokenizer_files(folder, seed=0, spm_size=60, separate=False, codes=CODES, drop=4):
    """Write source.spm, target.spm, vocab.json (and target_vocab.json with ``separate``) and
    tokenizer_config.json into ``folder``; returns the vocabulary size (the <pad> id + 1; with
    ``separate``, both vocabularies have that size)."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    source, target = _train(SOURCE_WORDS, rng, spm_size), _train(TARGET_WORDS, rng, spm_size)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    config = {"source_lang": "de", "target_lang": "en"}
    if separate:
        vocab, target_vocab = _vocab([source], rng, codes, drop), _vocab([target], rng, (), drop)
        # equal sizes, <pad> the same id, as Marian's converter makes them (a longer one loses pieces)
        size = min(len(vocab), len(target_vocab))
        vocab, target_vocab = ({piece: i for piece, i in v.items() if i < size - 1} | {"<pad>": size - 1}
                               for v in (vocab, target_vocab))
        (folder / "target_vocab.json").write_text(json.dumps(target_vocab, ensure_ascii=False), encoding="utf-8")
        config["separate_vocabs"] = True
    else:
        vocab = _vocab([source, target], rng, codes, drop)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return len(vocab)
