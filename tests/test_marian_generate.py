"""Decoding a Marian folder equals transformers' ``generate``: a small random ``MarianMTModel`` made here (no
download) is saved with ``save_pretrained`` beside tokenizer files made in the test (tests/marian_files.py) and
an opus-mt generation_config.json (num_beams 4, a short max_length so that some outputs end by the forced eos
and others by their own, pad banned, renormalized), then read by ``minitf.nmt.marian.from_pretrained``: greedy
decoding equals ``generate(num_beams=1)`` and beam search with the folder's rules
(:class:`minitf.nmt.decode.HuggingFaceRules`) equals ``generate(num_beams=4)`` token for token on 15 sentences,
with the folder's length_penalty and early_stopping and with others; the translated text equals
``batch_decode``. The paper's rules give other outputs on the same model (the test can tell them apart).
Skipped where the bench extra (torch, transformers) is not installed."""
import pytest

REASON = 'needs the bench extra (torch, transformers, safetensors): pip install -e ".[bench]"'
torch = pytest.importorskip("torch", reason=REASON)
transformers = pytest.importorskip("transformers", reason=REASON)
pytest.importorskip("safetensors", reason=REASON)
pytest.importorskip("sentencepiece", reason=REASON)

import minitf  # noqa: E402
from minitf.nmt import marian  # noqa: E402
from minitf.nmt.data import pad_batch  # noqa: E402
from minitf.nmt.decode import HuggingFaceRules, beam_search, greedy_decode, translate_texts  # noqa: E402
from minitf.nmt.marian_tokenizer import MarianTokenizer, read_generation_config  # noqa: E402
from tests.marian_files import MAX_LENGTH, make_marian_folder, sentences  # noqa: E402

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("safetensors", "bench")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_marian_folder(tmp_path_factory.mktemp("marian_generate") / "opus-mt-tiny")


@pytest.fixture(scope="module")
def hf(folder):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        tokenizer = transformers.MarianTokenizer.from_pretrained(str(folder))
    return transformers.MarianMTModel.from_pretrained(str(folder)).double().eval(), tokenizer


@pytest.fixture  # per test: under MINITF_STRICT=1 its arrays must come from the strict backend the test runs on
def ours(folder):
    from minitf import backend

    with backend.default_dtype("float64"):
        model, hf_config = marian.read(folder, dtype="float64")
    return model, MarianTokenizer.from_folder(folder), read_generation_config(folder, hf_config)


def hf_outputs(hf, texts, **options):
    """generate()'s outputs as id lists without the start token, the eos and the padding after it."""
    model, tokenizer = hf
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        sequences = model.generate(**batch, **options)
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    outputs = []
    for row in sequences.tolist():
        row = row[1:]
        outputs.append(row[:row.index(eos)] if eos in row else [t for t in row if t != pad])
    return outputs


def source(ours, texts):
    _, tokenizer, _ = ours
    return pad_batch(tokenizer.encode(texts), tokenizer.pad_id, eos_id=tokenizer.eos_id)


def test_the_folder_reads_as_opus_mt(ours, hf):
    """The folder's settings come through (beam 4, max_length 16 less the start, pad banned, forced eos,
    renormalized) and the batches are the same."""
    model, tokenizer, settings = ours
    pad = model.config.pad_id
    assert settings.num_beams == 4 and settings.max_len == MAX_LENGTH - 1 and settings.min_len == 0
    assert settings.rules == HuggingFaceRules(length_penalty=1.0, early_stopping=False, renormalize=True,
                                              forced_eos=True, banned_ids=(pad,))
    texts = sentences()
    assert (source(ours, texts) == hf[1](texts, padding=True, return_tensors="np")["input_ids"]).all()
    assert model.config.decoder_start_id == pad and model.config.eos_id == 0


def test_greedy_equals_generate(ours, hf):
    model, _, settings = ours
    texts = sentences()
    expected = hf_outputs(hf, texts, num_beams=1)
    got = greedy_decode(model, source(ours, texts), max_len=settings.max_len, min_len=settings.min_len,
                        rules=settings.rules)
    assert got == expected
    lengths = {len(ids) for ids in expected}
    assert MAX_LENGTH - 2 in lengths and min(lengths) < MAX_LENGTH - 2  # forced eos and own eos both met


@pytest.mark.parametrize("length_penalty, early_stopping", [(None, None), (2.0, False), (1.0, True), (1.0, "never"),
                                                            (2.0, "never")])
def test_beam_search_equals_generate(ours, hf, length_penalty, early_stopping):
    """num_beams 4 with the folder's length_penalty (1.0) and early_stopping (False), and with others
    (transformers takes them as generate()'s arguments, minitf as the rules' fields). On this model each rule
    counts: the paper's exact stop in place of the heuristic fails the folder's case, no renormalizing fails
    (2.0, False), ignoring True or "never" fails their cases."""
    model, _, settings = ours
    rules, options = settings.rules, {}
    if length_penalty is not None:
        rules = HuggingFaceRules(length_penalty, early_stopping, rules.renormalize, rules.forced_eos, rules.banned_ids)
        options = dict(length_penalty=length_penalty, early_stopping=early_stopping)
    texts = sentences()
    expected = hf_outputs(hf, texts, num_beams=4, **options)
    got = beam_search(model, source(ours, texts), beam_size=4, max_len=settings.max_len, min_len=settings.min_len,
                      rules=rules)
    assert got == expected
    if length_penalty is None:
        lengths = {len(ids) for ids in expected}
        assert MAX_LENGTH - 2 in lengths and min(lengths) < MAX_LENGTH - 2
        # the paper's rules (GNMT penalty, exact stop, no forced eos) decode this model otherwise
        paper = beam_search(model, source(ours, texts), beam_size=4, max_len=settings.max_len, alpha=0.6)
        assert paper != expected


def test_translated_text_equals_batch_decode(ours, hf):
    """translate_texts with the folder's settings (sorted into batches of 4 by length, its own padding) gives
    transformers' text of generate()'s output, greedy and beam."""
    model, tokenizer, settings = ours
    texts = sentences()
    for beam in (1, 4):
        expected = hf_outputs(hf, texts, num_beams=beam)
        got = translate_texts(model, tokenizer, texts, beam_size=beam, batch_size=4, max_len=settings.max_len,
                              min_len=settings.min_len, rules=settings.rules)
        assert got == hf[1].batch_decode(expected, skip_special_tokens=True)


def test_banned_words_are_banned_as_generate_bans_them(ours, hf):
    """bad_words_ids of single tokens other than pad (the greedy outputs' most frequent token): banned in
    both, and the outputs change."""
    model, _, settings = ours
    texts = sentences()
    plain = hf_outputs(hf, texts, num_beams=1)
    tokens = [t for ids in plain for t in ids]
    frequent = max(set(tokens), key=tokens.count)
    pad = model.config.pad_id
    expected = hf_outputs(hf, texts, num_beams=1, bad_words_ids=[[pad], [frequent]])
    rules = HuggingFaceRules(1.0, False, True, True, banned_ids=(pad, frequent))
    got = greedy_decode(model, source(ours, texts), max_len=settings.max_len, rules=rules)
    assert got == expected != plain and frequent not in sum(got, [])


def test_a_written_pad_is_read_as_generate_reads_it(ours, hf):
    """A "<pad>" written in a sentence is one token, the pad id (both tokenizers), which transformers' encoder
    attends to (its attention_mask comes from each sentence's length): greedy, beam 4 and translate_texts
    give generate()'s outputs, batched with longer and shorter sentences. generate() with the pads masked
    (an attention_mask from the ids, as minitf's was) gives other outputs: the test can tell."""
    model, tokenizer, settings = ours
    texts = sentences(6)
    texts[1], texts[4] = "<pad>", "Wir essen <pad> 3 Äpfel am 12. Mai"
    pad = model.config.pad_id
    assert all(pad in ids for ids in tokenizer.encode([texts[1], texts[4]]))
    src = source(ours, texts)
    batch = hf[1](texts, padding=True, return_tensors="pt")
    for beam in (1, 4):
        expected = hf_outputs(hf, texts, num_beams=beam)
        with torch.no_grad():
            masked = hf[0].generate(input_ids=batch["input_ids"], attention_mask=(batch["input_ids"] != pad).long(),
                                    num_beams=beam)
        masked = [row[1:row.index(0, 1)] if 0 in row[1:] else row[1:] for row in masked.tolist()]  # cut at eos
        assert masked != expected
        decode = greedy_decode if beam == 1 else lambda m, s, **kw: beam_search(m, s, beam_size=4, **kw)
        assert decode(model, src, max_len=settings.max_len, rules=settings.rules) == expected
        got = translate_texts(model, tokenizer, texts, beam_size=beam, batch_size=4, max_len=settings.max_len,
                              min_len=settings.min_len, rules=settings.rules)
        assert got == hf[1].batch_decode(expected, skip_special_tokens=True)
