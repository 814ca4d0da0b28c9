"""``python -m minitf.translate --checkpoint T5FOLDER`` equals transformers' ``generate``: a tiny random
``T5ForConditionalGeneration`` made here (no download) with a sentencepiece ``spiece.model`` and config.json's
task_specific_params; the command puts the folder's translation prefix before each sentence (or ``--prefix``'s) and
decodes by the folder's generation_config.json (generate()'s defaults: greedy, 20 new tokens), greedy and ``--beam
4``; its ids equal ``generate``'s, pad (T5's decoder start) generated where generate chooses it; a sentence longer
than the folder's n_positions and a ``--prefix`` the folder does not name are refused in one line, nothing written
on stdout. Float64 on both sides (transformers' norm in float64: tests/test_t5_parity.py). Skipped without the
bench extra."""
import json

import pytest
from tests.helpers import np
from tests.test_t5_folder import PREFIXES, spiece
from tests.test_t5_parity import hf_model, t5_norm_in_float64

from minitf.nmt.decode import beam_search, greedy_decode
from minitf.nmt.translate import load_translator, main
from minitf.training.errors import UsageError

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("sentencepiece", "bench")]
EOS, PAD = 1, 0
SENTENCES = ["the house is wonderful.", "the quick brown fox", "owning a dog is good for you",
             "Das Haus ist wunderbar.", "studies have shown that the lazy dog jumps"]
GERMAN = PREFIXES["translation_en_to_de"]["prefix"]


def folder_of(tmp_path, scale=((EOS, 0.8), (PAD, 0.0)), layout="v1.1", **changes):
    """A random T5 folder (vocabulary 72: 60 pieces, 10 sentinels, 2 spare) whose output rows are scaled by
    ``scale``'s (token, factor): eos as likely as some outputs end by it and others by the length, pad never or
    sometimes chosen; spiece.model, task prefixes."""
    import torch
    theirs = hf_model(layout, seed=5, vocab_size=72, num_decoder_layers=2, **changes)
    with torch.no_grad():
        for token, factor in scale:
            theirs.lm_head.weight[token] *= factor
    folder = tmp_path / "t5"
    theirs.save_pretrained(folder)
    spiece(folder / "spiece.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"extra_ids": 10}))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, task_specific_params=PREFIXES)))
    return theirs, folder


def generate(theirs, tokenizer, texts, **options):
    """generate()'s outputs for ``texts`` (eos appended, as T5's tokenizer does) as id lists without the start
    token, cut at the eos (the padding after it dropped); pad chosen before the eos stays."""
    import torch
    rows = [ids + [EOS] for ids in tokenizer.encode(texts)]
    ids = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    mask = np.arange(ids.shape[1])[None, :] < np.array([len(r) for r in rows])[:, None]
    with torch.no_grad(), t5_norm_in_float64():
        sequences = theirs.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                                    **options)
    outputs = []
    for row in sequences.tolist():
        row = row[1:]
        outputs.append(row[:row.index(EOS)] if EOS in row else row)
    return ids, outputs


@pytest.mark.parametrize("beam", [1, 4])
def test_translate_a_t5_folder_equals_generate_with_its_task_prefix(beam, tmp_path, capsys):
    theirs, folder = folder_of(tmp_path)
    model, tokenizer, settings, _ = load_translator(folder)
    assert tokenizer.encode(["x"]) == tokenizer.tokenizer.encode([GERMAN + "x"])  # the folder's translation prefix
    assert settings.beam_size == 1 and settings.max_len == 20  # generate()'s defaults: greedy, max_length 20
    src, expected = generate(theirs, tokenizer, SENTENCES, num_beams=beam)
    assert {len(row) for row in expected} != {20}  # some end by eos, not all by the length
    if beam == 1:
        got = greedy_decode(model, src, max_len=settings.max_len, rules=settings.rules)
    else:
        got = beam_search(model, src, beam_size=beam, max_len=settings.max_len, rules=settings.rules)
    assert got == expected
    (tmp_path / "src.txt").write_text("\n".join(SENTENCES) + "\n")
    capsys.readouterr()
    assert main(["--checkpoint", str(folder), "--src", str(tmp_path / "src.txt"), "--beam", str(beam)]) == 0
    assert capsys.readouterr().out.splitlines() == tokenizer.decode(expected)


def test_pad_is_generated_where_generate_chooses_it(tmp_path):
    """T5's decoder start is its pad (id 0), which generate may choose: its pad row made likely, generate chooses it
    inside outputs, and minitf's T5 rules (generates_pad) give the same ids where the translation kind's ban would
    not."""
    import dataclasses
    theirs, folder = folder_of(tmp_path, scale=((EOS, 0.8), (PAD, 4.0)))
    model, tokenizer, settings, _ = load_translator(folder)
    for beam in (1, 4):
        src, expected = generate(theirs, tokenizer, SENTENCES, num_beams=beam)
        assert any(PAD in row for row in expected)  # the case this test is for
        decode = (lambda rules: greedy_decode(model, src, max_len=settings.max_len, rules=rules)) if beam == 1 else \
            (lambda rules: beam_search(model, src, beam_size=beam, max_len=settings.max_len, rules=rules))
        assert decode(settings.rules) == expected
        assert decode(dataclasses.replace(settings.rules, generates_pad=False)) != expected


def test_prefix_by_name_or_text_and_a_prefix_the_folder_does_not_name(tmp_path, capsys):
    _, folder = folder_of(tmp_path)
    inner = load_translator(folder)[1].tokenizer
    for given, prefix in (("summarization", "summarize: "), ("summarize: ", "summarize: "), ("", "")):
        tokenizer = load_translator(folder, prefix=given)[1]
        assert tokenizer.encode(["the dog"]) == inner.encode([prefix + "the dog"])
    (tmp_path / "src.txt").write_text("the house\n")
    capsys.readouterr()  # transformers' progress bar while the folder was written
    assert main(["--checkpoint", str(folder), "--src", str(tmp_path / "src.txt"), "--prefix", "translate Fr: "]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "does not name --prefix 'translate Fr: '" in err and "translation_en_to_de" in err and "summarize: " in err
    config = json.loads((folder / "config.json").read_text())  # only a summarization prefix: no default to take
    (folder / "config.json").write_text(json.dumps(dict(config, task_specific_params={"summarization": {
        "prefix": "summarize: "}})))
    with pytest.raises(UsageError, match="no --prefix was given and it names no translation task.*summarization"):
        load_translator(folder)


def test_a_sentence_longer_than_n_positions_is_refused_naming_its_line(tmp_path, capsys):
    _, folder = folder_of(tmp_path, n_positions=32)
    tokenizer = load_translator(folder)[1]
    long = "studies have shown that owning a dog is good for you and the quick brown fox"
    assert len(tokenizer.encode([long])[0]) + 1 > 32 >= len(tokenizer.encode(["the house"])[0]) + 1
    (tmp_path / "src.txt").write_text(f"the house\n{long}\n")
    capsys.readouterr()
    assert main(["--checkpoint", str(folder), "--src", str(tmp_path / "src.txt")]) != 0
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "line 2 has" in err and "longer than the model's context of 32 (its n_positions)" in err
