"""``python -m minitf.generate --checkpoint T5_FOLDER_OR_RUN --prompt TEXT``: the encoder reads the prompt whole (no
task prefix, though the folder names some), the decoder writes the answer by the translation kind's decoders
(``Kind.answers``, ``Kind.answerer``): its output equals transformers' ``generate`` (greedy by the folder's
generation_config.json, and ``--beam 4``) on a tiny random v1.1 folder made here, float64 on both sides; a
minitf-written folder and a ``train.py --model t5`` run answer without torch as minitf's own decoders do; bad input
is one line (a usage error exit 2), nothing on stdout."""
import io
import sys

import pytest

import minitf
from minitf.lm.generate import main
from minitf.nmt.decode import beam_search, greedy_decode
from minitf.nmt.data import pad_batch
from tests.runs import train
from tests.test_lm_train import make_text
from tests.test_t5_folder import t5_folder
from tests.test_t5_train import SCRATCH

PROMPTS = ["the house is wonderful.", "summarize: the quick brown fox", "owning a dog is good for you"]


def answers(argv, capsys, stdin=None):
    """(exit status, stdout lines, stderr lines) of the command (``stdin``: the text it reads there)."""
    capsys.readouterr()
    if stdin is not None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
            return answers(argv, capsys)
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.strip().splitlines()


@pytest.mark.usefixtures("float64")
@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("sentencepiece", "bench")
@pytest.mark.parametrize("beam", [None, 4])
def test_generate_answers_a_t5_folder_as_transformers_generate(beam, tmp_path, capsys):
    from tests.test_t5_translate import EOS, PAD, folder_of, generate
    theirs, folder = folder_of(tmp_path, scale=((EOS, 1.0), (PAD, 0.0)))  # eos as likely as some answers end by it
    tokenizer = minitf.load(folder).tokenizer  # no prefix: the prompt is the whole input
    _, expected = generate(theirs, tokenizer, PROMPTS, **({} if beam is None else {"num_beams": beam}))
    assert {len(row) for row in expected} != {20}  # some end by eos, not all by generate()'s 20 tokens
    flags = [] if beam is None else ["--beam", str(beam)]
    for prompt, ids in zip(PROMPTS, expected):
        code, out, err = answers(["--checkpoint", str(folder), "--prompt", prompt] + flags, capsys)
        assert code == 0 and out == tokenizer.decode([ids]), (out, err)
    code, out, _ = answers(["--checkpoint", str(folder)] + flags, capsys, stdin="\n".join(PROMPTS) + "\n")
    assert code == 0 and out == tokenizer.decode(expected)


def decoded(loaded, prompt, beam=1):
    """minitf's own decoders on the prompt's ids and eos, by the loaded model's settings (no prefix)."""
    config, settings = loaded.model.config, loaded.decoding
    src = pad_batch([loaded.tokenizer.encode([prompt])[0]], config.pad_id, eos_id=config.eos_id)
    special = dict(max_len=settings.max_len or src.shape[1] + 50, rules=settings.rules, min_len=settings.min_len)
    ids = (greedy_decode(loaded.model, src, **special) if beam == 1 else
           beam_search(loaded.model, src, beam_size=beam, alpha=settings.alpha, **special))[0]
    return loaded.tokenizer.decode([ids])[0]


def check_answers(path, capsys):
    loaded = minitf.load(path)
    for prompt in PROMPTS[:2]:
        for beam in (1, 3):
            code, out, err = answers(["--checkpoint", str(path), "--prompt", prompt, "--beam", str(beam)], capsys)
            assert code == 0 and out == [decoded(loaded, prompt, beam)], (out, err)


@pytest.mark.extra("safetensors", "hf")  # the folder is written by minitf's writer
def test_generate_answers_a_minitf_written_folder_without_its_task_prefix(tmp_path, capsys):
    folder = t5_folder(tmp_path / "t5")
    check_answers(folder, capsys)
    translated = minitf.load(folder).kind.translator(minitf.load(folder))[1]
    assert translated.prefix  # the folder names a translation prefix, which generate does not put
    code, out, _ = answers(["--checkpoint", str(folder), "--prompt", PROMPTS[0]], capsys)
    assert out != [] and code == 0


@pytest.mark.extra("safetensors", "hf")
@pytest.mark.parametrize("argv, stdin, status, words", [
    (["--prompt", "  "], None, 2, "--prompt is empty"),
    (["--prompt", "the house", "--temperature", "0.7"], None, 2, "--temperature sample a language model's next tokens"),
    (["--prompt", "the house", "--top-k", "5", "--seed", "1"], None, 2, "--top-k and --seed sample"),
    (["--prompt", "the house", "--max-new-tokens", "40"], None, 2,
     "--max-new-tokens 40 does not fit the model's context of 32"),
    ([], "the house\n\nthe dog\n", 1, "standard input: line 2 is empty"),  # bad data: exit 1, as for any kind
])
def test_bad_input_is_one_line(argv, stdin, status, words, tmp_path, capsys):
    folder = t5_folder(tmp_path / "t5")
    if "--max-new-tokens" in argv:  # a folder with a context: n_positions 32
        import json
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(dict(config, n_positions=32)))
    code, out, err = answers(["--checkpoint", str(folder)] + argv, capsys, stdin)
    assert code == status and out == [] and len(err) == 1 and words in err[0], err


def test_generate_answers_a_t5_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(make_text(tmp_path) + SCRATCH + ["--max-steps", "4", "--out", run]) == 0
    check_answers(run, capsys)
