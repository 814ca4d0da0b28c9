"""minitf's Marian tokenizer (minitf/nmt/marian_tokenizer.py) against transformers' ``MarianTokenizer`` on
tokenizer files made in the test (tests/marian_files.py: tiny sentencepiece models, a vocab.json whose ids
are not sentencepiece's, some pieces left out): equal ids (source and target side, the appended ``</s>``
being the batching's), equal decoded text, for sentences with punctuation, digits, characters neither model
knows, language codes and special tokens written in the text; separate vocabularies too. And the files'
bad input, each a one-line DataError naming the file."""
import json
import shutil

import pytest
from hypothesis import given, settings, strategies as st

from minitf.nmt.marian_tokenizer import MarianTokenizer
from minitf.training.errors import DataError
from tests.marian_files import write_tokenizer_files

pytest.importorskip("sentencepiece")

SENTENCES = [
    "Ich habe Hunger.",
    "Der Hund läuft schnell nach Hause, und die Katze schläft!",
    "Wir essen 3 Äpfel am 12. Mai 2024 (für 7,50 Euro)?",
    ">>deu<< Was ist das?",                  # a language code of the vocabulary
    ">>fra<<Brücke",                          # ... right before the text
    ">>xyz<< Mädchen über die Straße",        # a code the vocabulary lacks: <unk>
    ">> nicht <<ein Code",                    # ">>" ... "<<": one piece for transformers too
    "a >>deu<< in the middle is text",
    "Zebra € Ω 中文 ß ø",                      # characters neither sentencepiece model has seen
    "  spaces   here  ",
    "eine </s> im Text, <unk> und <pad>",      # special tokens written in the text: one id each
    "",
    "1234567890 0.5 -3 +4 #5 @6 %",
]


def hf_tokenizer(folder, **kwargs):
    transformers = pytest.importorskip("transformers")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        return transformers.MarianTokenizer.from_pretrained(str(folder), **kwargs)


@pytest.fixture(scope="module")
def joint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian_tok")
    write_tokenizer_files(folder)
    return folder


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian_tok_sep")
    write_tokenizer_files(folder, seed=1, separate=True)
    return folder


def test_the_files_exercise_what_they_should(joint):
    """The made files are a fair test: some vocabulary ids differ from the pieces' sentencepiece ids,
    some pieces are missing (unknown), and the two models segment a word differently."""
    import sentencepiece

    ours = MarianTokenizer.from_folder(joint)
    source = sentencepiece.SentencePieceProcessor(model_file=str(joint / "source.spm"))
    pieces = [p for text in SENTENCES for p in source.encode(text, out_type=str)]
    assert any(ours.vocab.get(p) not in (None, source.piece_to_id(p)) for p in pieces)
    assert any(p not in ours.vocab for p in pieces)
    assert ours.pieces("Hause", target=False) != ours.pieces("Hause", target=True)
    assert (ours.eos_id, ours.unk_id, ours.pad_id, ours.bos_id) == (0, 1, len(ours.vocab) - 1, len(ours.vocab) - 1)


@pytest.mark.extra("transformers", "bench")
@pytest.mark.parametrize("kind", ["joint", "separate"])
def test_ids_and_text_equal_transformers(kind, joint, separate):
    folder = joint if kind == "joint" else separate
    hf, ours = hf_tokenizer(folder), MarianTokenizer.from_folder(folder)
    source, target = ours.encode(SENTENCES), ours.encode_target(SENTENCES)
    for text, src, tgt in zip(SENTENCES, source, target):
        assert src + [ours.eos_id] == hf(text)["input_ids"], text
        assert tgt + [ours.target_eos_id] == hf(text_target=text)["input_ids"], text
        assert ours.pieces(text) == hf.tokenize(text), text
    assert 1 in sum(source, [])                                    # unknown pieces met
    # decoding stops at the first eos (minitf's interface: a padded batch's rows); transformers drops it
    eos = ours.target_eos_id
    cut = [ids[:ids.index(eos)] if eos in ids else ids for ids in target]
    assert cut[10] != target[10]                                   # "</s>" written in a text
    texts = ours.decode(target)
    assert texts == [hf.decode(ids, skip_special_tokens=True) for ids in cut]
    assert texts == hf.batch_decode(cut, skip_special_tokens=True)
    assert ours.vocab_size == len(hf.encoder)


@pytest.mark.extra("transformers", "bench")
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_decoding_any_ids_equals_transformers(joint, data):
    """Any ids below the vocabulary size (specials, language codes, pieces sentencepiece does not know)
    decode to transformers' text with the special tokens dropped."""
    hf, ours = _cached(joint)
    ids = data.draw(st.lists(st.integers(1, ours.vocab_size - 1), max_size=20))  # eos only ends a list
    assert ours.decode([ids]) == [hf.decode(ids, skip_special_tokens=True)]


_CACHE = {}


def _cached(folder):
    if folder not in _CACHE:
        _CACHE[folder] = hf_tokenizer(folder), MarianTokenizer.from_folder(folder)
    return _CACHE[folder]


@pytest.mark.extra("transformers", "bench")
def test_kept_and_saved_tokenizers_are_the_same(joint, tmp_path):
    """model_bytes -> from_bytes (a run's tokenizer.model) and save -> a folder transformers reads give the
    same ids and text; equal tokenizers have equal sha256."""
    ours = MarianTokenizer.from_folder(joint)
    kept = MarianTokenizer.from_bytes(ours.model_bytes())
    assert kept.sha256 == ours.sha256 and kept.encode(SENTENCES) == ours.encode(SENTENCES)
    ours.save(tmp_path / "saved")
    hf = hf_tokenizer(tmp_path / "saved")
    assert [ids + [0] for ids in ours.encode(SENTENCES)] == [hf(s)["input_ids"] for s in SENTENCES]
    assert MarianTokenizer.from_folder(tmp_path / "saved").sha256 == ours.sha256
    import pickle  # a data-loading process gets it as its bytes (no sentencepiece processor pickled)

    assert pickle.loads(pickle.dumps(ours)).encode(SENTENCES) == ours.encode(SENTENCES)


# --------------------------------------------------------------------------- bad input
def _copy(joint, tmp_path):
    folder = tmp_path / "folder"
    shutil.copytree(joint, folder)
    return folder


@pytest.mark.parametrize("name", ["vocab.json", "source.spm", "target.spm"])
def test_a_missing_file_is_named(joint, tmp_path, name):
    folder = _copy(joint, tmp_path)
    (folder / name).unlink()
    with pytest.raises(DataError, match=rf"^{folder} has no {name}; a Marian folder's tokenizer is "):
        MarianTokenizer.from_folder(folder)


@pytest.mark.parametrize("damage, expected", [
    (lambda f: (f / "source.spm").write_bytes(b"not a model"), r"source\.spm is not a sentencepiece model"),
    (lambda f: (f / "vocab.json").write_text("{nope"), r"vocab\.json is not readable JSON"),
    (lambda f: (f / "vocab.json").write_text("[1, 2]"), r"vocab\.json is not a JSON object"),
    (lambda f: (f / "vocab.json").write_text('{"</s>": 0, "<unk>": "1"}'), r"piece '<unk>' has id '1'"),
    (lambda f: (f / "vocab.json").write_text('{"</s>": 0, "a": 1, "<pad>": 2}'), r"vocab\.json has no '<unk>'"),
    (lambda f: (f / "tokenizer_config.json").write_text('{"separate_vocabs": true}'), r"has no target_vocab\.json"),
    (lambda f: (f / "tokenizer_config.json").write_text('{"eos_token": 5}'), r"eos_token is 5"),
])
def test_damaged_files_are_one_line(joint, tmp_path, damage, expected):
    folder = _copy(joint, tmp_path)
    damage(folder)
    with pytest.raises(DataError, match=expected) as error:
        MarianTokenizer.from_folder(folder)
    assert "\n" not in str(error.value)


def test_bytes_of_another_tokenizer_are_refused():
    with pytest.raises(DataError, match="is not a Marian tokenizer written by minitf"):
        MarianTokenizer.from_bytes(json.dumps({"format": "minitf-char-1", "chars": "ab"}).encode())
    with pytest.raises(DataError, match="is not a Marian tokenizer written by minitf"):
        MarianTokenizer.from_bytes(b"\x0a\x05piece")  # a sentencepiece protobuf
