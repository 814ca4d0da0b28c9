"""python -m minitf.generate: a small random GPT saved as a Hugging Face GPT-2 folder with a
tokenizer made here by the ``tokenizers`` package (no download), run through the real
command. Its greedy text is minitf.sampling.generate's, a seed makes sampling reproducible, a
terminal session answers as a pipe does, and bad input is one line. Tests that read a folder
need the ``hf`` extra (safetensors, tokenizers) and skip with the reason without it."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from minitf import backend
from minitf.gpt import GPT
from minitf.lm import gpt2
from minitf.sampling import generate
from minitf.lm.generate import main
from minitf.lm.kind import KIND as LM_KIND
from minitf.training.kind import Loaded
from tests.runs import CPU_ENV, ROOT, one_error_line, read_line

np = backend.host
needs_hf = [pytest.mark.extra("tokenizers", "hf"), pytest.mark.extra("safetensors", "hf")]
TEXT = ["the cat sees a dog and the dog likes the cat", "a small house with a tree and a bird",
        "once upon a time there was a bird in the house"] * 4
MAX_LEN = 24
PROMPTS = ["the cat", "a bird in a house"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A GPT-2 folder: a random 2-layer GPT (weights of std 0.5, so that its choices vary) and a
    byte-level BPE trained on TEXT. TEXT has no line break, so no token holds one and every
    answer is one line."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    path = tmp_path_factory.mktemp("gpt2")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=80, special_tokens=["<|endoftext|>"],
                                                            show_progress=False))
    tokenizer.save(str(path / "tokenizer.json"))
    backend.manual_seed(0)
    model = GPT.preset("gpt2", tokenizer.get_vocab_size(), max_len=MAX_LEN, d_model=16, num_heads=2, num_layers=2,
                       d_ff=32, dropout=0.0, init_std=0.5)
    gpt2.save_pretrained(model, path)
    return path


def command(folder, *args, stdin=None):
    """``python -m minitf.generate --from-pretrained FOLDER ARGS`` with ``stdin`` (text) on a pipe."""
    return subprocess.run([sys.executable, "-m", "minitf.generate", "--from-pretrained", str(folder),
                           *map(str, args)], input=stdin or "", capture_output=True, text=True, cwd=ROOT,
                          env=CPU_ENV, timeout=120)


def expected(folder, prompt, max_new_tokens, **options):
    """The prompt and its continuation by minitf.sampling.generate, decoded by the folder's tokenizer."""
    from tokenizers import Tokenizer
    model = gpt2.from_pretrained(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    out = generate(model, np.array([ids]), max_new_tokens, **options)[0].tolist()
    return tokenizer.decode(out, skip_special_tokens=False)


def _with_hf(test):
    for mark in needs_hf:
        test = mark(test)
    return test


@_with_hf
def test_greedy_text_is_minitf_gpt_generates(folder):
    result = command(folder, "--temperature", 0, "--max-new-tokens", 12, stdin="".join(p + "\n" for p in PROMPTS))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    answers = [expected(folder, prompt, 12, temperature=0) for prompt in PROMPTS]
    assert result.stdout == "".join(a + "\n" for a in answers)
    assert all(a.startswith(p) and len(a) > len(p) for a, p in zip(answers, PROMPTS)), answers
    one = command(folder, "--prompt", PROMPTS[1], "--temperature", 0, "--max-new-tokens", 12)
    assert one.returncode == 0 and one.stdout == answers[1] + "\n"


@_with_hf
def test_a_seed_makes_sampling_reproducible(folder):
    """Line n is sampled with seed (SEED, n); the same seed gives the same text, another seed another,
    and --temperature, --top-k and --top-p reach the sampler."""
    stdin = "".join(p + "\n" for p in PROMPTS)
    options = ["--max-new-tokens", 16, "--temperature", 0.8, "--top-k", 20, "--top-p", 0.95]
    first, again, other = (command(folder, *options, "--seed", seed, stdin=stdin) for seed in (3, 3, 4))
    assert first.returncode == again.returncode == other.returncode == 0, first.stderr + other.stderr
    assert first.stdout == again.stdout and first.stdout != other.stdout
    assert first.stdout.splitlines() == [expected(folder, prompt, 16, temperature=0.8, top_k=20, top_p=0.95,
                                                  seed=[3, n]) for n, prompt in enumerate(PROMPTS, start=1)]
    greedy = command(folder, "--max-new-tokens", 16, "--temperature", 0, stdin=stdin)
    assert first.stdout != greedy.stdout


@_with_hf
def test_generation_stops_at_the_end_of_text_token_and_does_not_write_it(folder, tmp_path):
    from tokenizers import Tokenizer
    model = gpt2.from_pretrained(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tokenizer.encode(PROMPTS[0], add_special_tokens=False).ids
    new = generate(model, np.array([ids]), 12, temperature=0)[0, len(ids):].tolist()
    stop = next(i for i in range(1, len(new)) if new[i] not in new[:i])  # the first token not seen before
    eos_folder = tmp_path / "eos"
    shutil.copytree(folder, eos_folder)
    config = json.loads((eos_folder / "config.json").read_text())
    (eos_folder / "config.json").write_text(json.dumps(config | {"eos_token_id": new[stop]}))
    result = command(eos_folder, "--prompt", PROMPTS[0], "--temperature", 0, "--max-new-tokens", 12)
    assert result.returncode == 0, result.stderr
    assert result.stdout == tokenizer.decode(ids + new[:stop], skip_special_tokens=False) + "\n"


@_with_hf
def test_vocab_json_and_merges_txt_read_as_gpt2s_byte_level_bpe(folder, tmp_path):
    """A folder with GPT-2's two tokenizer files instead of tokenizer.json gives the same text."""
    from tokenizers import Tokenizer
    bpe_folder = tmp_path / "bpe"
    shutil.copytree(folder, bpe_folder)
    Tokenizer.from_file(str(folder / "tokenizer.json")).model.save(str(bpe_folder))  # vocab.json, merges.txt
    (bpe_folder / "tokenizer.json").unlink()
    stdin = "".join(p + "\n" for p in PROMPTS)
    result = command(bpe_folder, "--temperature", 0, "--max-new-tokens", 12, stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert result.stdout == command(folder, "--temperature", 0, "--max-new-tokens", 12, stdin=stdin).stdout


@_with_hf
@pytest.mark.extra("transformers", "bench")
def test_vocab_json_and_merges_txt_encode_as_transformers_gpt2_tokenizer(folder, tmp_path):
    """The fallback reads GPT-2's two files as transformers' own GPT2Tokenizer does: the same ids
    (its end-of-text token one special token) and the same text back."""
    from tokenizers import Tokenizer
    from transformers import GPT2Tokenizer

    from minitf.lm.data import read_pretrained_tokenizer
    Tokenizer.from_file(str(folder / "tokenizer.json")).model.save(str(tmp_path))
    eos = "<|endoftext|>"
    theirs = GPT2Tokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), unk_token=eos,
                           bos_token=eos, eos_token=eos)
    ours = read_pretrained_tokenizer(tmp_path, eos_id=theirs.eos_token_id)
    texts = PROMPTS + [" once  upon a time" + eos + "the cat", "the  tree\tand a bird"]
    assert ours.encode(texts) == [theirs.encode(text) for text in texts]
    assert ours.decode(ours.encode(texts)) == [theirs.decode(theirs.encode(text)) for text in texts]


# --------------------------------------------------------------------------- interactive
@_with_hf
@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_a_terminal_session_answers_each_prompt_as_a_pipe_does(folder):
    """Each typed line is answered before the next is typed, with the seed of its line number, so
    the answers are the pipe's; an empty line is a one-line error and the session goes on."""
    import pty
    options = ["--max-new-tokens", 10, "--seed", 7]
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "minitf.generate", "--from-pretrained", str(folder),
                                *map(str, options)], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=ROOT, env=CPU_ENV)
    os.close(slave)
    try:
        answers = []
        for prompt in PROMPTS:  # the next line is typed only after the answer to this one came
            os.write(master, prompt.encode("utf-8") + b"\n")
            answers.append(read_line(process.stdout.fileno()))
        os.write(master, b"\n")  # an empty prompt: an error line, then the session goes on
        os.write(master, PROMPTS[0].encode("utf-8") + b"\n")
        answers.append(read_line(process.stdout.fileno()))
        os.write(master, b"\x04")  # Ctrl-D: end of input on a terminal
        assert process.wait(timeout=60) == 0
        err = process.stderr.read().decode().splitlines()
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    assert err[0].startswith("Type a prompt") and "Ctrl-D" in err[0]
    assert [line for line in err[1:] if line] == ["error: that prompt is empty; expected text to continue"], err
    piped = command(folder, *options, stdin="".join(p + "\n" for p in PROMPTS + ["a cat", PROMPTS[0]]))
    assert piped.returncode == 0, piped.stderr
    assert answers[:2] == piped.stdout.splitlines()[:2]  # lines 1 and 2
    assert answers[2] == piped.stdout.splitlines()[3]  # line 4: the empty line counted as line 3
    assert all(a.startswith(p) for a, p in zip(answers, PROMPTS + [PROMPTS[0]]))


# --------------------------------------------------------------------------- bad input
def _copy(folder, tmp_path, change):
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    change(copy)
    return copy


def _damage(name, data):
    return lambda copy: (copy / name).write_bytes(data)


def _vocab_and_merges(copy):
    from tokenizers import Tokenizer
    Tokenizer.from_file(str(copy / "tokenizer.json")).model.save(str(copy))
    (copy / "tokenizer.json").unlink()
    (copy / "vocab.json").write_text('{"a": 0, "b"')


def _poisoned(copy):
    import safetensors.numpy as safetensors_numpy
    tensors = safetensors_numpy.load_file(str(copy / "model.safetensors"))
    tensors["transformer.h.0.mlp.c_fc.weight"][0, 0] = np.nan
    safetensors_numpy.save_file(tensors, str(copy / "model.safetensors"))


def _config_change(**change):
    def apply(copy):
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps(config | change))
    return apply


def _smaller_model(copy):
    gpt2.save_pretrained(GPT.preset("gpt2", 40, max_len=MAX_LEN, d_model=16, num_heads=2, num_layers=1, d_ff=32), copy)


HF = "hf"
#: Sources that need no folder: the line comes before any file is read.
NO_FOLDER = {"none": lambda tmp: ["--from-pretrained", tmp / "missing"], "checkpoint": lambda tmp: ["--checkpoint", tmp],
             "both": lambda tmp: ["--from-pretrained", tmp, "--checkpoint", tmp], "neither": lambda tmp: []}
#: case -> (source: a key of NO_FOLDER, "missing" (a folder that does not exist, read with the hf extra), HF (the
#: test's folder) or a change to a copy of it; arguments; stdin bytes; exit status; what the line says)
BAD_INPUTS = {
    "temperature below 0": ("none", ["--temperature", "-0.5"], None, 2, "--temperature: expected a finite number >= 0"),
    "temperature nan": ("none", ["--temperature", "nan"], None, 2, "--temperature: expected a finite number >= 0"),
    "top-p 0": ("none", ["--top-p", "0"], None, 2, "--top-p: expected a number above 0 and at most 1"),
    "top-p above 1": ("none", ["--top-p", "1.5"], None, 2, "--top-p: expected a number above 0 and at most 1"),
    "top-k below 0": ("none", ["--top-k", "-1"], None, 2, "--top-k: expected an integer >= 0"),
    "max-new-tokens 0": ("none", ["--max-new-tokens", "0"], None, 2, "--max-new-tokens: expected a positive int"),
    "seed below 0": ("none", ["--seed", "-3"], None, 2, "--seed: expected an integer >= 0"),
    "empty prompt": ("none", ["--prompt", ""], None, 2, "--prompt is empty"),
    "blank prompt": ("none", ["--prompt", "  "], None, 2, "--prompt is empty"),
    "no prompt on stdin": ("none", [], b"", 1, "standard input is empty; expected one prompt per line"),
    "an empty line on stdin": ("none", [], b"the cat\n\na dog\n", 1, "standard input: line 2 is empty"),
    "stdin not UTF-8": ("none", [], b"the cat\n\xff\n", 1, "standard input is not valid UTF-8 at line 2"),
    "a folder that is no run": ("checkpoint", ["--prompt", "x"], None, 1, "is neither a checkpoint folder"),
    "two sources": ("both", ["--prompt", "x"], None, 2, "not allowed with argument"),
    "no source": ("neither", ["--prompt", "x"], None, 2, "one of the arguments --from-pretrained --checkpoint"),
    "missing folder": ("missing", ["--prompt", "x"], None, 1, "is not a folder; give a Hugging Face GPT-2 folder"),
    "no tokenizer": (lambda copy: (copy / "tokenizer.json").unlink(), ["--prompt", "x"], None, 1,
                     "has no tokenizer: expected tokenizer.json, or vocab.json and merges.txt"),
    "damaged tokenizer.json": (_damage("tokenizer.json", b'{"version": '), ["--prompt", "x"], None, 1,
                               "tokenizer.json cannot be read as a tokenizer"),
    "damaged vocab.json": (_vocab_and_merges, ["--prompt", "x"], None, 1,
                           "merges.txt cannot be read as a tokenizer"),
    "damaged model.safetensors": (_damage("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json"),
                                  ["--prompt", "x"], None, 1, "model.safetensors is not a readable safetensors file"),
    "a tokenizer larger than the model": (_smaller_model, ["--prompt", "x"], None, 1, "do not belong together"),
    "a NaN weight": (_poisoned, ["--prompt", "the cat", "--max-new-tokens", 4], None, 1,
                     "tensor transformer.h.0.mlp.c_fc.weight holds 1 NaN"),
    "layer_norm_epsilon null": (_config_change(layer_norm_epsilon=None), ["--prompt", "the cat", "--max-new-tokens", 4],
                                None, 1, "layer_norm_epsilon is None; it must be a float"),
    "max-new-tokens beyond the positions": (HF, ["--prompt", "x", "--max-new-tokens", MAX_LEN + 1], None, 2,
                                            f"does not fit the model's {MAX_LEN} positions"),
    "a prompt too long for the positions": (HF, ["--max-new-tokens", MAX_LEN - 2], b"the cat\nthe cat sees a dog\n",
                                            1, "standard input: line 2 has"),
}


@pytest.mark.parametrize("case", [pytest.param(case, marks=[] if BAD_INPUTS[case][0] in NO_FOLDER else needs_hf)
                                  for case in sorted(BAD_INPUTS)])
def test_bad_input_is_one_line_and_a_nonzero_exit(case, request, tmp_path, capsys, monkeypatch):
    where, args, stdin, status, says = BAD_INPUTS[case]
    if where in NO_FOLDER:
        source = NO_FOLDER[where](tmp_path)
    elif where == "missing":
        source = ["--from-pretrained", tmp_path / "missing"]
    else:
        folder = request.getfixturevalue("folder")
        source = ["--from-pretrained", folder if where == HF else _copy(folder, tmp_path, where)]
    (tmp_path / "stdin").write_bytes(stdin or b"")
    monkeypatch.setattr(sys, "stdin", open(tmp_path / "stdin"))  # a file: not a terminal
    try:
        code = main([str(a) for a in source + args])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    captured = capsys.readouterr()
    sys.stdin.close()
    line = one_error_line(captured.err.strip().splitlines(), prog="minitf.generate")
    assert code == status and says in line and captured.out == "", (case, code, line)


def test_without_the_hf_extra_the_command_says_what_to_install(tmp_path, capsys, monkeypatch):
    for module in ("safetensors", "safetensors.numpy", "tokenizers"):
        monkeypatch.setitem(sys.modules, module, None)  # its import raises ImportError, installed or not
    code = main(["--from-pretrained", str(tmp_path), "--prompt", "x"])
    line = one_error_line(capsys.readouterr().err.strip().splitlines(), prog="minitf.generate")
    assert code == 1 and "needs the safetensors and tokenizers packages" in line, line
    assert "pip install -e '.[hf]'" in line, line


@_with_hf
def test_bad_input_through_the_real_command_is_one_line(folder, tmp_path):
    copy = _copy(folder, tmp_path, _damage("tokenizer.json", b"\x00\x01"))
    for result, status in [(command(copy, "--prompt", "the cat"), 1),
                           (command(folder, "--prompt", "the cat", "--max-new-tokens", MAX_LEN + 1), 2)]:
        assert result.returncode == status and result.stdout == "", result.stderr
        one_error_line(result.stderr.strip().splitlines(), prog="minitf.generate")


# --------------------------------------------------------------------------- what reaches the sampler
CHARS = "abcdefgh "


def _char_model(monkeypatch, max_len=MAX_LEN, poison=False):
    """Route --from-pretrained to a random GPT of ``max_len`` positions over the characters CHARS (the character
    tokenizer of a run), ``poison``: one NaN gain; no folder, no extra needed."""
    from minitf.lm import generate as command_module
    from minitf.lm.data import CharTokenizer, TextTokenizer
    tokenizer = TextTokenizer(CharTokenizer(CHARS))
    backend.manual_seed(0)
    model = GPT.preset("gpt2", tokenizer.vocab_size, max_len=max_len, d_model=8, num_heads=2, num_layers=1, d_ff=16)
    if poison:
        model.decoder.final_norm.gamma.data[0] = np.nan
    monkeypatch.setattr(command_module, "load_generating",
                        lambda path, warn, **how: Loaded(model, tokenizer, LM_KIND, pathlib.Path(path)))
    return model, tokenizer


def _run(capsys, *args):
    code = main(["--from-pretrained", "unused", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_beam_is_refused_for_a_language_model_in_one_line(monkeypatch, capsys):
    """--beam is a T5 model's (Kind.answers); a model that samples each next token refuses it, writing nothing."""
    _char_model(monkeypatch)
    code, out, err = _run(capsys, "--prompt", "abc", "--beam", 2)
    line = one_error_line(err.strip().splitlines(), prog="minitf.generate")
    assert code == 2 and out == "" and "--beam is for a model that answers a prompt (T5)" in line, (code, err)


def test_non_finite_logits_stop_sampling_in_one_line(monkeypatch, capsys):
    """Before: exit 0, the prompt followed by the sampler's id 0 from NaN logits, over and over."""
    _char_model(monkeypatch, poison=True)
    code, out, err = _run(capsys, "--prompt", "abc", "--max-new-tokens", 3)
    line = one_error_line(err.strip().splitlines(), prog="minitf.generate")
    assert code == 1 and out == "" and "the model's logits for new token 1 hold NaN or infinity" in line, (code, err)


def test_a_prompt_with_characters_the_tokenizer_lacks_is_refused_naming_them(monkeypatch, capsys):
    """Before: the character tokenizer read them as id 0 silently and wrote U+FFFD in their place."""
    _char_model(monkeypatch)
    code, out, err = _run(capsys, "--prompt", "a bad égg\tcafé €5", "--max-new-tokens", 2)
    line = one_error_line(err.strip().splitlines(), prog="minitf.generate")
    assert code == 1 and out == "", (code, out, err)
    assert "--prompt has characters the tokenizer cannot represent: 'é' (U+00E9), '\\t' (U+0009), '€' (U+20AC), " \
           "'5' (U+0035)" in line, line
    # its alphabet only: answered (seeded: unseeded, the sampler could draw id 0, the unknown character, as a new token)
    code, out, err = _run(capsys, "--prompt", "a bad egg", "--max-new-tokens", 2, "--seed", 1)
    assert code == 0 and out.startswith("a bad egg") and "\ufffd" not in out, (out, err)


def test_the_default_max_new_tokens_fits_the_models_context(monkeypatch, capsys, tmp_path):
    """The command train.py prints (no --max-new-tokens) works for a model of 8 positions: each prompt gets
    min(50, what its context leaves) new tokens. Before: "--max-new-tokens 50 does not fit the model's 8
    positions", a flag the user never gave. An explicit value too large is still refused."""
    model, tokenizer = _char_model(monkeypatch, max_len=8)
    (tmp_path / "stdin").write_text("a\nabcdefg\n")
    monkeypatch.setattr(sys, "stdin", open(tmp_path / "stdin"))  # a file: not a terminal
    code, out, err = _run(capsys, "--temperature", 0)
    sys.stdin.close()
    assert code == 0 and err == "", err
    answers = out.splitlines(keepends=False)
    assert [len(tokenizer.encode([a])[0]) for a in answers] == [9, 9], answers  # 8 positions fed, + the last token
    code, out, err = _run(capsys, "--prompt", "abcdefgha", "--temperature", 0)  # 9 tokens: no room for even one
    assert code == 1 and "--prompt has 9 tokens; the model has 8 positions" in err, err
    code, out, err = _run(capsys, "--prompt", "a", "--max-new-tokens", 9)
    assert code == 2 and "--max-new-tokens 9 does not fit the model's 8 positions" in err, err
