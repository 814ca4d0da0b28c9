"""minitf.bert.tokenizer: BERT's WordPiece (pure Python) and RoBERTa's byte-level BPE.

The plain tests derive each expected word from one rule of BERT's basic tokenizer, on hand-picked cases, and
check the one-line errors. The extra-marked ones compare token ids with transformers' own tokenizers, for
vocabularies built here and written into tmp_path, over random texts (hypothesis): mixed scripts, accents and
combining marks, CJK (and the edges of its ranges), punctuation, control characters, every kind of whitespace,
special tokens inside the text and words longer than max_input_chars_per_word."""
import json
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitf.bert import tokenizer as bt
from minitf.training.errors import DataError



# ---------------------------------------------------------------------------------------------------------------
# The rules, one at a time (no extra)


def test_clean_text_drops_controls_and_makes_every_whitespace_a_space():
    controls = "\x00\x01\x7f\u200b\ufeff\ufffd"  # NUL, C0, DEL, zero-width space (Cf), BOM (Cf), replacement
    spaces = "\t\n\r\u00a0\u2028\u3000"            # tab, newline, CR, no-break, line separator, ideographic
    assert all(unicodedata.category(ch).startswith("C") for ch in controls if ch not in "\x00\ufffd")
    assert bt.clean_text(f"a{controls}b{spaces}c") == "ab" + " " * len(spaces) + "c"
    assert bt.basic_tokenize(f"a{controls}b{spaces}c") == ["ab", "c"]


def test_each_cjk_ideograph_is_a_word_and_other_scripts_are_not_split():
    edges = [chr(low) for low, _ in bt.CJK_RANGES] + [chr(high) for _, high in bt.CJK_RANGES]
    # assigned (an unassigned one is a control character, dropped) and unchanged by NFD (U+F900 becomes U+8C48)
    ideographs = [ch for ch in edges if unicodedata.category(ch) == "Lo" and unicodedata.normalize("NFD", ch) == ch]
    assert len(ideographs) >= 8
    text = "ab" + "".join(ideographs) + "cd"
    assert bt.basic_tokenize(text) == ["ab", *ideographs, "cd"]
    assert bt.basic_tokenize(text, chinese=False) == [text]
    hangul, kana = "한국어", "ひらがな"  # not in the ranges: one word each
    assert bt.basic_tokenize(f"{hangul} {kana}", accents=False) == [hangul, kana]
    # (with accents stripped, NFD splits the Hangul syllables into their letters and drops the kana's voicing mark)


def test_accents_go_with_lower_casing_unless_told_otherwise():
    word = "Ça\u0301fé"  # C-cedilla (precomposed), a + combining acute, e-acute (precomposed)
    bare = "".join(ch for ch in unicodedata.normalize("NFD", word) if not unicodedata.combining(ch))
    assert bare == "Cafe"
    assert bt.basic_tokenize(word) == [bare.lower()]                                # lower-casing strips them
    assert bt.basic_tokenize(word, accents=False) == [word.lower()]                 # unless strip_accents=False
    assert bt.basic_tokenize(word, lowercase=False) == [word]                       # cased BERT keeps them
    assert bt.basic_tokenize(word, lowercase=False, accents=True) == [bare]


def test_lower_casing_is_one_character_at_a_time():
    word = "ΟΔΟΣ"  # str.lower() would end it with the final sigma; one character at a time it is sigma
    assert bt.basic_tokenize(word, accents=False) == ["".join(ch.lower() for ch in word)]
    assert bt.basic_tokenize(word, accents=False) != [word.lower()]


def test_each_punctuation_character_is_a_word_of_its_own():
    ascii_symbols = "$+<=>^`|~"       # not Unicode punctuation (S*) but BERT's ASCII punctuation
    assert not any(unicodedata.category(ch).startswith("P") for ch in ascii_symbols)
    unicode_punct = "¿«»—…"           # P* outside ASCII
    assert bt.basic_tokenize(f"a{ascii_symbols}b{unicode_punct}c") == ["a", *ascii_symbols, "b", *unicode_punct, "c"]
    assert bt.basic_tokenize("don't") == ["don", "'", "t"]
    assert bt.basic_tokenize("€5") == ["€5"]  # a currency sign outside ASCII is no punctuation


def test_wordpiece_takes_the_longest_piece_first_and_continues_with_hashes():
    vocab = {"un", "unaff", "##aff", "##able", "##a", "##ff", "[UNK]"}
    assert bt.wordpiece("unaffable", vocab, "[UNK]") == ["unaff", "##able"]    # "unaff" before "un"
    assert bt.wordpiece("unable", vocab, "[UNK]") == ["un", "##able"]
    assert bt.wordpiece("unx", vocab, "[UNK]") == ["[UNK]"]                     # no piece for "x": the whole word
    assert bt.wordpiece("aff", vocab, "[UNK]") == ["[UNK]"]                     # "##aff" cannot start a word
    assert bt.wordpiece("un" + "a" * 9, vocab | {"##aa"}, "[UNK]", max_chars=10) == ["[UNK]"]  # 11 > 10 characters
    assert bt.wordpiece("un" + "a" * 8, vocab | {"##aa"}, "[UNK]", max_chars=10) == ["un"] + ["##aa"] * 4


@pytest.mark.parametrize("lowercase", [True, False])
def test_ascii_takes_a_short_way_to_the_same_words(lowercase):
    text = "".join(map(chr, range(128))) + " Hello,World!! don't x\x01y a\x0bb 3.14 $5 [MASK]"
    assert bt.basic_tokenize(text, lowercase) == bt.basic_tokenize_unicode(text, lowercase)
    # vertical tab and form feed are white space to Python, but control characters first: dropped, no split
    assert bt.basic_tokenize("a\x01b\x0bc\x0cd") == ["abcd"]


def _vocab_folder(path, tokens, **config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
    if config:
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def test_special_tokens_in_the_text_are_kept_whole_and_pairs_get_types(tmp_path):
    tokens = [*bt.SPECIALS, "paris", "is", "the", "of", "france", "."]
    tok = bt.read_tokenizer(_vocab_folder(tmp_path, tokens))
    ids = {t: i for i, t in enumerate(tokens)}
    ids_, types = tok.encode("Paris is the [MASK] of France.", "The [mask]")
    expected = ["[CLS]", "paris", "is", "the", "[MASK]", "of", "france", ".", "[SEP]",
                "the", "[UNK]", "[UNK]", "[UNK]", "[SEP]"]  # "[mask]" is no special token: "[", "mask", "]"
    assert tok.tokens(ids_) == expected and ids_ == [ids[t] for t in expected]
    assert types == [0] * 9 + [1] * 5
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.mask_token) == (0, 1, 2, 3, 4, "[MASK]")
    # decode leaves every special token out ([UNK] too) and the space before "." (the WordPiece decoder's cleanup)
    assert tok.decode(ids_) == " ".join(t for t in expected if t not in bt.SPECIALS).replace(" .", ".")


def test_encode_batch_pads_on_the_right(tmp_path):
    tok = bt.read_tokenizer(_vocab_folder(tmp_path, [*bt.SPECIALS, "a", "b"]))
    ids, types, padding = tok.encode_batch(["a b a", "b"], pairs=["a", "a b"])
    rows = [tok.encode("a b a", "a"), tok.encode("b", "a b")]
    assert ids.dtype.name == types.dtype.name == "int64" and padding.dtype.name == "bool"
    assert ids.shape == (2, max(len(r[0]) for r in rows))
    for row, (i, t) in enumerate(rows):
        assert list(ids[row, :len(i)]) == i and list(types[row, :len(t)]) == t
        assert not padding[row, :len(i)].any() and padding[row, len(i):].all()
        assert (ids[row, len(i):] == tok.pad_id).all()


def test_model_bytes_are_json_and_round_trip(tmp_path):
    tok = bt.read_tokenizer(_vocab_folder(tmp_path, [*bt.SPECIALS, "A", "##b", "a"], do_lower_case=False,
                                          strip_accents=True))
    data = tok.model_bytes()
    assert json.loads(data)["format"] == bt.FORMAT and bt.EncoderTokenizer.written(data)
    back = bt.from_bytes(data)
    assert back.sha256 == tok.sha256 and back.encode("Áb a") == tok.encode("Áb a") == ([2, 5, 6, 7, 3], [0] * 5)
    assert bt.WordPieceTokenizer.from_bytes(data).vocab == tok.vocab
    with pytest.raises(DataError, match="is not a BERT tokenizer written by minitf"):
        bt.from_bytes(b"\x80\x04pickle")
    with pytest.raises(DataError, match="token id 8 is not in the vocabulary of 8 tokens"):
        tok.decode([2, 8])


def test_additional_special_tokens_are_kept_whole_and_left_out_by_decode(tmp_path):
    tok = bt.read_tokenizer(_vocab_folder(tmp_path, [*bt.SPECIALS, "<e1>", "a", "<", ">", "e", "##1"],
                                          additional_special_tokens=["<e1>"]))
    ids = tok.encode("a<e1>a")[0]
    assert tok.tokens(ids) == ["[CLS]", "a", "<e1>", "a", "[SEP]"] and tok.decode(ids) == "a a"
    tok.save(tmp_path / "saved")
    assert bt.read_tokenizer(tmp_path / "saved").encode("a<e1>a")[0] == ids


def test_train_wordpiece_is_deterministic_and_learns_the_frequent_words():
    texts = ["the cat sat on the mat", "the cat ate the rat", "The Cat!"] * 5
    a, b = bt.train_wordpiece(texts, 40), bt.train_wordpiece(list(texts), 40)
    assert a.vocab == b.vocab and a.sha256 == b.sha256 and a.vocab_size <= 40
    assert a.vocab[:5] == list(bt.SPECIALS)
    assert a.tokens(a.encode("the cat")[0]) == ["[CLS]", "the", "cat", "[SEP]"]
    assert "[UNK]" not in a.tokens(a.encode("mat rat sat")[0])
    small = bt.train_wordpiece(texts, 8)  # room for three characters only: the rest are unknown
    assert small.vocab_size == 8 and "[UNK]" in small.tokens(small.encode("the cat")[0])


def test_save_writes_a_folder_read_back_the_same(tmp_path):
    tok = bt.train_wordpiece(["Héllo wörld, hello there"], 30)
    tok.save(tmp_path / "out")
    back = bt.read_tokenizer(tmp_path / "out")
    assert back.vocab == tok.vocab and back.encode("hello world") == tok.encode("hello world")


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "has no tokenizer: neither tokenizer.json nor vocab.txt"),
    (lambda p: _vocab_folder(p, ["[PAD]", "[UNK]", "[CLS]", "a"]), "lacks the special tokens [SEP], [MASK]"),
    (lambda p: _vocab_folder(p, ["[PAD]", "[CLS]", "[SEP]", "[MASK]"]), "lacks the special token [UNK];"),
    (lambda p: (p.mkdir(), (p / "vocab.txt").write_bytes(b"[PAD]\n[UNK]\n\xff\xfe\n")), "is not UTF-8 (byte 12"),
    (lambda p: (p.mkdir(), (p / "vocab.txt").write_bytes(b"")), "is empty"),
    (lambda p: (p.mkdir(), (p / "tokenizer.json").write_text('{"model": {"type": "Unigram"}}')),
     "holds a 'Unigram' model; a bert folder's tokenizer.json holds WordPiece"),
    (lambda p: (p.mkdir(), (p / "tokenizer.json").write_text(
        '{"model": {"type": "WordPiece", "vocab": {}}, "normalizer": {"type": "NFC"}}')),
     "with the normalizer 'NFC'; BERT's tokenizer.json has a BertNormalizer"),
    (lambda p: (p.mkdir(), (p / "tokenizer.json").write_bytes(b"\xff{")), "is not UTF-8 JSON"),
    (lambda p: (p.mkdir(), (p / "tokenizer.json").write_text(
        '{"model": {"type": "WordPiece"}, "normalizer": {"type": "BertNormalizer"}, '
        '"pre_tokenizer": {"type": "BertPreTokenizer"}}')), "WordPiece model is not as transformers writes it"),
])
def test_a_bad_folder_is_one_line(make, message, tmp_path):
    folder = tmp_path / "model"
    make(folder)
    with pytest.raises(DataError) as error:
        bt.read_tokenizer(folder, {"model_type": "bert"})
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.extra("tokenizers", "hf")
def test_a_roberta_vocabulary_without_its_mask_is_one_line(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a": 4}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(DataError, match="lacks the special token <mask>; a RoBERTa vocabulary holds") as error:
        bt.read_tokenizer(tmp_path, {"model_type": "roberta"})
    assert "\n" not in str(error.value)


def test_a_roberta_folder_without_files_names_them(tmp_path):
    with pytest.raises(DataError, match="neither tokenizer.json nor vocab.json and merges.txt"):
        bt.read_tokenizer(tmp_path, {"model_type": "roberta"})


# ---------------------------------------------------------------------------------------------------------------
# Equal to transformers (extra)

#: the characters of the random texts: each class of character the basic tokenizer treats apart
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
ACCENTED = "àáâãäåçèéêëìíîïñòóôõöùúûüýÿÀÉÎÕÜŠšŽžıİŁłßǅ"
MARKS = "\u0300\u0301\u0308\u0327"                       # combining grave, acute, diaeresis, cedilla (Mn)
SCRIPTS = "αβγΣσςΟΔабвгДЖאבגابت한국어ひらがなカタカナ€£¥"
#: CJK, the edges of its ranges among them; only characters Python's Unicode database has (an unassigned one is a
#: control character to Python and may be a letter to the tokenizers package's newer tables)
CJK = "中文字東京" + "".join(ch for ch in map(chr, (0x3400, 0x4DBF, 0xF900, 0xFAFF, 0x2B81D, 0x2B81F, 0x2B820, 0x2B920,
                                                  0x20000, 0x2F800, 0x9FFF))
                            if unicodedata.category(ch) != "Cn")
PUNCT = ".,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`¿«»—…、。"
SPACES = " \t\n\r\u00a0\u2028\u3000\x0b\x0c\x85"
CONTROLS = "\x00\x01\x1f\x7f\u200b\u200e\ufeff\ufffd"
ALPHABET = LETTERS + ACCENTED + MARKS + SCRIPTS + CJK + PUNCT + SPACES + CONTROLS
#: pieces of words the vocabulary has (whole words, starts and continuations)
WORDS = ["the", "he", "cafe", "café", "naive", "un", "##aff", "##able", "##s", "##ing", "ab", "##ab", "##a", "##b",
         "東京", "οδοσ", "straße"]


def _test_vocab():
    """Every character of the alphabet that can start or continue a word (lower- and upper-case, stripped and
    not), a few longer pieces, and [unused0] (a vocabulary entry that is no special token)."""
    chars = set()
    for ch in ALPHABET + ALPHABET.lower() + bt.strip_accents(ALPHABET) + bt.strip_accents(ALPHABET).lower():
        if not (bt.is_whitespace(ch) or bt.is_control(ch)):
            chars.add(ch)
    chars = sorted(chars - set(MARKS[:2]))  # two marks unknown: a word with one is [UNK]
    return list(dict.fromkeys([*bt.SPECIALS, "[unused0]", *chars, *("##" + ch for ch in chars), *WORDS]))


texts = st.lists(st.one_of(st.text(alphabet=ALPHABET, max_size=12),
                           st.sampled_from(["[MASK]", "[SEP]", "[mask]", "[unused0]", " [CLS] ", "a" * 101,
                                            "ab" * 50, "ab" * 51, "unaffable", "Naïve", "CAFÉ", " don't", " 's",
                                            " do not", " ' ", " ,", " n't"])),
                 max_size=6).map("".join)

CONFIGS = [{}, {"do_lower_case": False}, {"do_lower_case": True, "strip_accents": False},
           {"do_lower_case": False, "strip_accents": True}, {"tokenize_chinese_chars": False},
           {"clean_up_tokenization_spaces": True}]


@pytest.fixture(scope="module")
def wordpiece_pairs(tmp_path_factory):
    """(ours, transformers') for each config, from vocab.txt and from the tokenizer.json transformers writes."""
    from transformers import AutoTokenizer, BertTokenizer, BertTokenizerFast
    pairs = []
    for n, config in enumerate(CONFIGS):
        folder = _vocab_folder(tmp_path_factory.mktemp(f"vocab{n}"), _test_vocab(), **config)
        theirs = BertTokenizer.from_pretrained(folder, **config)
        pairs.append((bt.read_tokenizer(folder), theirs))
        fast = BertTokenizerFast.from_pretrained(folder, **config)
        saved = tmp_path_factory.mktemp(f"json{n}")
        fast.save_pretrained(saved)
        (saved / "vocab.txt").unlink(missing_ok=True)  # only tokenizer.json is read
        assert (saved / "tokenizer.json").is_file()
        pairs.append((bt.read_tokenizer(saved), AutoTokenizer.from_pretrained(saved)))
    return pairs


def test_the_test_alphabet_reaches_every_rule():
    """The random texts can meet each rule: a character of every class the basic tokenizer treats apart."""
    assert any(bt.is_control(ch) for ch in ALPHABET) and any(bt.is_cjk(ch) for ch in ALPHABET)
    assert any(bt.is_punctuation(ch) and ord(ch) > 127 for ch in ALPHABET)
    assert any(unicodedata.category(ch) == "Mn" for ch in ALPHABET)
    assert any(ch.isspace() and ch not in " \t\n\r" for ch in ALPHABET)
    assert not bt.is_cjk(chr(0x2B820)) and bt.is_cjk(chr(0x2B81D)) and chr(0x2B820) in ALPHABET  # see CJK_RANGES


@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("tokenizers", "hf")
@given(text=texts, pair=st.one_of(st.none(), texts))
def test_wordpiece_ids_equal_transformers(wordpiece_pairs, text, pair):
    for ours, theirs in wordpiece_pairs:
        encoded = theirs(text, pair)
        ids, types = ours.encode(text, pair)
        assert ids == encoded["input_ids"], (ours.tokens(ids), theirs.convert_ids_to_tokens(encoded["input_ids"]))
        assert types == encoded["token_type_ids"]
        assert ours.tokens(ids) == theirs.convert_ids_to_tokens(ids)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("tokenizers", "hf")
def test_a_trained_vocabulary_saved_is_read_by_transformers(tmp_path):
    from transformers import AutoTokenizer
    sample = ["In the beginning God created the heavens and the earth.", "Ünïcödé wörds, 東京 and ΟΔΟΣ!"] * 4
    ours = bt.train_wordpiece(sample, 60)
    ours.save(tmp_path)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    for text in sample + ["unseen wordz [MASK] here"]:
        assert ours.encode(text, "a pair")[0] == theirs(text, "a pair")["input_ids"]
    assert (theirs.pad_token_id, theirs.mask_token_id, theirs.unk_token_id) == (0, 4, 1)


def _byte_alphabet():
    """GPT-2's printable stand-in for each byte (bytes_to_unicode)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], n = chr(256 + n), n + 1
    return [chars[b] for b in range(256)], chars


@pytest.fixture(scope="module")
def roberta_folder(tmp_path_factory):
    """vocab.json + merges.txt: the specials, every byte and the merges spelling a few words (each merge's halves
    made by earlier merges)."""
    alphabet, byte_char = _byte_alphabet()
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    merges = []
    for word in [" the", " cat", "the", " ca", " café", "ing", " sing", " 東京", "ab"]:
        pieces = [byte_char[b] for b in word.encode("utf-8")]
        while len(pieces) > 1:
            merged = pieces[0] + pieces[1]
            if merged not in vocab:
                merges.append(f"{pieces[0]} {pieces[1]}")
                vocab[merged] = len(vocab)
            pieces = [merged, *pieces[2:]]
    vocab["<mask>"] = len(vocab)
    folder = tmp_path_factory.mktemp("roberta")
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return folder


roberta_texts = st.lists(st.one_of(st.text(alphabet=ALPHABET, max_size=12),
                                   st.sampled_from([" the cat", "<mask>", " <mask>", "  <mask> ", "<s>", "</s>",
                                                    " café", " singing", "東京"])), max_size=6).map("".join)


@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("tokenizers", "hf")
@given(text=roberta_texts, pair=st.one_of(st.none(), roberta_texts))
def test_roberta_ids_equal_transformers(roberta_folder, tmp_path_factory, text, pair):
    from transformers import RobertaTokenizerFast
    theirs = RobertaTokenizerFast.from_pretrained(roberta_folder)
    ours = bt.read_tokenizer(roberta_folder, {"model_type": "roberta"})
    ids, types = ours.encode(text, pair)
    assert ids == theirs(text, pair)["input_ids"]
    assert types == [0] * len(ids) and ours.tokens(ids) == theirs.convert_ids_to_tokens(ids)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert (ours.mask_token, ours.mask_id, ours.pad_id) == ("<mask>", theirs.mask_token_id, theirs.pad_token_id)
    back = bt.from_bytes(ours.model_bytes())
    assert back.encode(text, pair) == (ids, types) and back.sha256 == ours.sha256


@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("tokenizers", "hf")
def test_roberta_saved_and_its_tokenizer_json_read_back(roberta_folder, tmp_path):
    from transformers import AutoTokenizer, RobertaTokenizerFast
    ours = bt.read_tokenizer(roberta_folder, {"model_type": "roberta"})
    ours.save(tmp_path / "ours")
    theirs = AutoTokenizer.from_pretrained(tmp_path / "ours")
    text = "The cat <mask> singing, 東京."
    assert ours.encode(text, " the")[0] == theirs(text, " the")["input_ids"]
    RobertaTokenizerFast.from_pretrained(roberta_folder).save_pretrained(tmp_path / "hf")
    again = bt.read_tokenizer(tmp_path / "hf", {"model_type": "roberta"})
    assert again.encode(text, " the") == ours.encode(text, " the")


@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("tokenizers", "hf")
@pytest.mark.parametrize("lstrip", [True, False])
def test_roberta_mask_takes_the_space_before_it_where_the_folder_says(roberta_folder, tmp_path, lstrip):
    """roberta-base's <mask> has lstrip: " <mask>" is the mask alone, not "Ġ" and the mask."""
    from transformers import AutoTokenizer
    import shutil
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(roberta_folder / name, tmp_path / name)
    mask = {"content": "<mask>", "lstrip": lstrip, "rstrip": False, "normalized": False, "special": True,
            "single_word": False}
    mask_id = json.loads((roberta_folder / "vocab.json").read_text())["<mask>"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "RobertaTokenizer",
                                                                 "added_tokens_decoder": {str(mask_id): mask}}))
    ours, theirs = bt.read_tokenizer(tmp_path, {"model_type": "roberta"}), AutoTokenizer.from_pretrained(tmp_path)
    ids = ours.encode("The cat <mask>.")[0]
    assert ids == theirs("The cat <mask>.")["input_ids"]
    assert ours.tokens(ids)[-4:-1] == (["Ġcat", "<mask>", "."] if lstrip else ["Ġ", "<mask>", "."])


@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("tokenizers", "hf")
def test_additional_special_tokens_as_transformers_reads_them(tmp_path):
    from transformers import AutoTokenizer, BertTokenizer
    folder = _vocab_folder(tmp_path / "in", [*bt.SPECIALS, "<e1>", "a", "<", ">", "e", "##1"],
                           additional_special_tokens=["<e1>"])
    ours = bt.read_tokenizer(folder)
    ours.save(tmp_path / "saved")
    for theirs in (BertTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(tmp_path / "saved")):
        ids = theirs("a<e1>a <e1>")["input_ids"]
        assert ours.encode("a<e1>a <e1>")[0] == ids and ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
