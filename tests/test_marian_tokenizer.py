"""minitf's Marian tokenizer (minitf/nmt/marian_tokenizer.py) against transformers' ``MarianTokenizer`` on
tokenizer files made in the test (tests/marian_files.py: tiny sentencepiece models, a vocab.json whose ids
are not sentencepiece's, some pieces left out): equal ids (source and target side, the appended ``</s>``
being the batching's), equal decoded text, for sentences with punctuation, digits, characters neither model
knows, language codes and special tokens written in the text; separate vocabularies too. And the files'
bad input, each a one-line DataError naming the file. And a folder's generation_config.json read as the
decoding's settings, values minitf does not compute refused in one line."""
import json
import shutil

import pytest
from hypothesis import given, settings, strategies as st

from minitf.nmt.decode import HuggingFaceRules
from minitf.nmt.marian_tokenizer import MarianTokenizer, read_generation_config
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


# --------------------------------------------------------------------------- generation_config.json
HF_CONFIG = {"model_type": "marian", "vocab_size": 100, "pad_token_id": 99, "eos_token_id": 0,
             "decoder_start_token_id": 99}
OPUS_MT = {"bad_words_ids": [[99]], "bos_token_id": 0, "decoder_start_token_id": 99, "eos_token_id": 0,
           "forced_eos_token_id": 0, "max_length": 512, "num_beams": 6, "pad_token_id": 99,
           "renormalize_logits": True, "transformers_version": "4.32.0.dev0"}


def _settings(tmp_path, generation=None, hf_config=HF_CONFIG):
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return read_generation_config(tmp_path, hf_config)


def test_generation_settings_of_an_opus_mt_folder(tmp_path):
    settings = _settings(tmp_path, OPUS_MT)
    assert (settings.num_beams, settings.max_len, settings.min_len) == (6, 511, 0)  # max_length counts the start
    assert settings.rules == HuggingFaceRules(length_penalty=1.0, early_stopping=False, renormalize=True,
                                              forced_eos=True, banned_ids=(99,))
    changed = _settings(tmp_path, OPUS_MT | {"length_penalty": 0.6, "early_stopping": "never", "min_length": 3,
                                             "max_new_tokens": 40, "bad_words_ids": [[99], [0], [7]]})
    assert (changed.max_len, changed.min_len) == (40, 2)
    assert changed.rules.banned_ids == (99, 7)  # the eos is never banned, as in transformers
    assert (changed.rules.length_penalty, changed.rules.early_stopping) == (0.6, "never")


def test_without_generation_config_json_config_json_and_then_generate_defaults_apply(tmp_path):
    """An old folder: config.json's own num_beams, max_length, bad_words_ids; none: generate()'s defaults (20 new
    tokens: transformers 5.25 adds the start token to its default max_length of 20; tests/test_t5_translate.py
    compares with generate() itself)."""
    settings = _settings(tmp_path, hf_config=HF_CONFIG | {"num_beams": 4, "max_length": 512, "bad_words_ids": [[99]]})
    assert (settings.num_beams, settings.max_len) == (4, 511) and settings.rules.banned_ids == (99,)
    bare = _settings(tmp_path)
    assert (bare.num_beams, bare.max_len) == (1, 20)
    assert bare.rules == HuggingFaceRules()


@pytest.mark.parametrize("change, expected", [
    ({"do_sample": True}, r"do_sample is True; minitf\.translate decodes by greedy or beam search without it: set "
                          r"it to false"),
    ({"no_repeat_ngram_size": 3}, r"no_repeat_ngram_size is 3; .* set it to 0"),
    ({"repetition_penalty": 1.2}, r"repetition_penalty is 1\.2"),
    ({"bad_words_ids": [[5, 6]]}, r"bad_words_ids holds \[5, 6\]; minitf bans single tokens only"),
    ({"bad_words_ids": [[100]]}, r"bad_words_ids holds \[100\]"),
    ({"forced_eos_token_id": 5}, r"forced_eos_token_id is 5, not the eos_token_id 0"),
    ({"eos_token_id": [0, 5]}, r"eos_token_id is \[0, 5\]; minitf decodes with one id there"),
    ({"eos_token_id": 3}, r"eos_token_id is 3 but config\.json's is 0"),
    ({"decoder_start_token_id": 0}, r"decoder_start_token_id is 0 but config\.json's is 99"),
    ({"early_stopping": "sometimes"}, r"early_stopping is 'sometimes'; it must be true, false or \"never\""),
    ({"num_beams": 0}, r"num_beams is 0; it must be at least 1"),
    ({"max_length": 1}, r"max_length is 1; it must be at least 2"),
    ({"num_beams": "4"}, r"num_beams is '4'; it must be an int"),
    ({"renormalize_logits": "yes"}, r"renormalize_logits is 'yes'; it must be a bool"),
    ({"length_penalty": None}, None),  # null: the default, as transformers reads it
])
def test_generation_config_values_minitf_does_not_compute_are_refused_in_one_line(tmp_path, change, expected):
    if expected is None:
        assert _settings(tmp_path, OPUS_MT | change).rules.length_penalty == 1.0
        return
    with pytest.raises(ValueError, match=expected) as error:
        _settings(tmp_path, OPUS_MT | change)
    assert str(error.value).startswith(str(tmp_path / "generation_config.json")) and "\n" not in str(error.value)


def test_an_unreadable_generation_config_is_named(tmp_path):
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(ValueError, match=r"generation_config\.json is not readable JSON .*delete it"):
        read_generation_config(tmp_path, HF_CONFIG)
