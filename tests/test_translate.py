"""minitf.translate: a file or a pipe in, translations out, BLEU against references;
interactive under a terminal (each line answered as soon as it is typed, the same
answers as a pipe); and which checkpoint of a run folder it uses. A Hugging Face Marian
folder in place of a run (files, pipes, --ref, greedy and beam, the folder's settings or the
flags'; a missing tokenizer file), and the folders of the other command's model (GPT-2 to
translate, Marian to generate) refused naming the right command. (Bad input:
tests/test_cli_errors.py; damaged checkpoints: tests/test_checkpoint.py.)"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from minitf.training import checkpoint as ckpt
from tests.runs import ROOT, TINY, copy_run, make_corpus, one_error_line, read_line, train, translate


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run of 30 steps (enough for non-empty answers) and its corpus; tests only read it."""
    folder = tmp_path_factory.mktemp("translate")
    run = folder / "run"
    corpus = make_corpus(folder)
    assert train(corpus + TINY + ["--max-steps", "30", "--eval-every", "100", "--save-every", "30",
                                  "--out", run]) == 0
    return dict(run=run, corpus=corpus)


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_translate_cli_reads_stdin_and_scores_references(tiny_run):
    corpus = tiny_run["corpus"]
    src = pathlib.Path(corpus[corpus.index("--test-src") + 1])
    ref = pathlib.Path(corpus[corpus.index("--test-tgt") + 1])
    result = subprocess.run([sys.executable, "-m", "minitf.translate", "--checkpoint", str(tiny_run["run"]),
                             "--beam", "2", "--reference", str(ref)], input=src.read_bytes(), capture_output=True,
                            cwd=ROOT, env=_env(), timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert len(lines) == len(src.read_text().splitlines())
    assert "BLEU" in result.stderr.decode()


# --------------------------------------------------------------------------- interactive
def _on_a_terminal(run, beam, type_lines):
    """``python -m minitf.translate`` with a pseudo-terminal as stdin: ``type_lines(write, read_answer)``
    types, then Ctrl-D ends the session. Returns what it returned and stderr."""
    import pty
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "minitf.translate", "--checkpoint", str(run), "--beam",
                                str(beam)], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=ROOT, env=_env())
    os.close(slave)
    try:
        typed = type_lines(lambda data: os.write(master, data), lambda: read_line(process.stdout.fileno()))
        os.write(master, b"\x04")  # Ctrl-D: end of input on a terminal
        assert process.wait(timeout=60) == 0
        return typed, process.stderr.read().decode()
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_each_line_is_answered_as_it_is_typed(tiny_run):
    sentences = ["Der hund sieht ein haus.", "Die katze mag den vogel.", "Ein kleine baum."]

    def type_lines(write, read_answer):
        answers = []
        for sentence in sentences:  # the next line is typed only after the answer to this one came
            write(sentence.encode("utf-8") + b"\n")
            answers.append(read_answer())
        write(b"\n")  # an empty line gets an empty answer
        assert read_answer() == ""
        return answers

    answers, err = _on_a_terminal(tiny_run["run"], 2, type_lines)
    assert "Ctrl-D" in err and "error" not in err
    assert all(answers), answers
    batched = subprocess.run([sys.executable, "-m", "minitf.translate", "--checkpoint", str(tiny_run["run"]),
                              "--beam", "2"], input="\n".join(sentences) + "\n", capture_output=True, text=True,
                             cwd=ROOT, env=_env(), timeout=120)
    assert batched.returncode == 0 and batched.stdout.splitlines() == answers


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_a_line_longer_than_the_terminal_passes_is_answered_with_a_warning(tiny_run):
    """A terminal (canonical mode) passes at most 4,095 bytes of a typed line and drops the rest:
    a one-line warning says so and what to do, never silently. (What is left is longer than the run's
    context, --max-len 100: an error line, and the session answers the next line.)"""
    def type_lines(write, read_answer):
        long_line = ("Der hund sieht ein haus. " * 240).encode("utf-8")  # 6,000 bytes
        for start in range(0, len(long_line), 512):  # typed in pieces, as a paste arrives
            write(long_line[start:start + 512])
        write(b"\nDer hund.\n")
        return read_answer()

    answer, err = _on_a_terminal(tiny_run["run"], 1, type_lines)
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "4095 bytes" in warnings[0] and "--src FILE" in warnings[0], err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "longer than the model's context of 100" in errors[0] and answer.strip(), err


# --------------------------------------------------------------------------- which checkpoint of a run folder
def test_best_json_is_relative_so_a_run_folder_can_move(world, tmp_path, capsys, monkeypatch):
    moved = tmp_path / "moved"
    shutil.copytree(world["ref"], moved)
    assert json.loads((moved / "best.json").read_text())["checkpoint"] == "checkpoints/step-00000006"
    code, err, out = translate(["--checkpoint", moved, "--beam", 1], capsys, b"Der hund.\n", monkeypatch, tmp_path)
    assert code == 0 and err == [] and len(out.splitlines()) == 1


def test_best_json_pointing_outside_its_run_folder_is_ignored_with_a_warning(world, tmp_path, capsys, monkeypatch):
    run = copy_run(world["ref"], tmp_path / "run")
    elsewhere = tmp_path / "elsewhere" / "ck"
    shutil.copytree(ckpt.checkpoint_path(world["othertok"], 4), elsewhere)
    (run / "best.json").write_text(json.dumps({"model": "last", "checkpoint": "../elsewhere/ck"}))
    seen = []
    real = ckpt.load_checkpoint_model
    monkeypatch.setattr(ckpt, "load_checkpoint_model", lambda folder, *how: seen.append(pathlib.Path(folder)) or real(folder, *how))
    code, err, out = translate(["--checkpoint", run, "--beam", 1, "--src", world["corpus"][1]], capsys)
    assert code == 0 and len(err) == 1, err
    assert err[0].startswith("warning: ignoring best.json") and "outside the run folder" in err[0]
    assert seen == [ckpt.checkpoint_path(run, 6)]


@pytest.mark.parametrize("moment", ["before its files are read", "while its files are read"])
def test_a_checkpoint_deleted_under_translate_gives_way_to_the_newer_one(world, tmp_path, capsys, monkeypatch, moment):
    """A run saving with --keep 1 deletes the checkpoint that translate has just listed: translate lists
    the folder again and uses the newer one, with no warning (it was not damaged)."""
    run = copy_run(world["ref"], tmp_path / "run")
    for step in (2, 6):
        shutil.rmtree(ckpt.checkpoint_path(run, step))  # --keep 1: only step 4 is listed
    saved = []

    def the_run_saves_step_6():  # as the trainer does: the new checkpoint in place, then the old one pruned
        if not saved:
            saved.append(shutil.copytree(ckpt.checkpoint_path(world["ref"], 6), ckpt.checkpoint_path(run, 6)))
            ckpt.prune_checkpoints(run, keep=1)
            assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-00000006"]

    if moment == "before its files are read":
        real = ckpt.load_checkpoint_model
        monkeypatch.setattr(ckpt, "load_checkpoint_model", lambda folder, *how: the_run_saves_step_6() or real(folder, *how))
    else:
        real = ckpt.file_sha256
        monkeypatch.setattr(ckpt, "file_sha256", lambda file: the_run_saves_step_6() or real(file))
    code, err, out = translate(["--checkpoint", run, "--beam", "1"], capsys, b"Der hund.\n", monkeypatch, tmp_path)
    assert saved and code == 0 and out.count("\n") == 1 and not err, err
    warnings = []
    assert ckpt.load_model(run, warn=warnings.append)[2]["step"] == 6 and not warnings


# --------------------------------------------------------------------------- a Hugging Face Marian folder
@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A Marian folder made in the test (tests/marian_files.py: a random MarianMTModel, tokenizer files, an
    opus-mt generation_config.json with num_beams 4 and max_length 16), its sources and minitf's own
    translations of them in float32 (as the command decodes) with the rules its files give, read here
    independently of the command: beam 4 and greedy."""
    pytest.importorskip("transformers")
    from minitf.nmt.marian import from_pretrained
    from minitf.nmt.decode import HuggingFaceRules, translate_texts
    from minitf.nmt.marian_tokenizer import MarianTokenizer
    from tests.marian_files import MAX_LENGTH, make_marian_folder, sentences

    base = tmp_path_factory.mktemp("marian_cli")
    folder = make_marian_folder(base / "opus-mt-tiny")
    texts = sentences()
    (base / "src.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    model, tokenizer = from_pretrained(folder), MarianTokenizer.from_folder(folder)
    rules = HuggingFaceRules(length_penalty=1.0, early_stopping=False, renormalize=True, forced_eos=True,
                             banned_ids=(tokenizer.pad_id,))
    expected = {beam: translate_texts(model, tokenizer, texts, beam, max_len=MAX_LENGTH - 1, min_len=0, rules=rules)
                for beam in (1, 4)}
    expected["max-len 3"] = translate_texts(model, tokenizer, texts, 2, max_len=3, min_len=0, rules=rules)
    return dict(folder=folder, src=base / "src.txt", texts=texts, expected=expected)


@pytest.mark.extra("transformers", "bench")
def test_a_marian_folder_translates_files_and_pipes_through_the_cli(marian):
    """--checkpoint FOLDER: a file with --ref (BLEU on stderr), the folder's beam 4 and max_length by
    default; a pipe with --beam 1 (greedy); --max-len in place of the folder's."""
    run = lambda *flags, **how: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "minitf.translate", "--checkpoint", str(marian["folder"]), *map(str, flags)],
        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120, **how)
    result = run("--src", marian["src"], "--reference", marian["src"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == marian["expected"][4]
    assert "BLEU" in result.stderr and "error" not in result.stderr.lower()
    assert marian["expected"][4] != marian["expected"][1]  # beam and greedy differ here: the test can tell
    greedy = run("--beam", 1, input="\n".join(marian["texts"]) + "\n")
    assert greedy.returncode == 0 and greedy.stdout.splitlines() == marian["expected"][1], greedy.stderr
    short = run("--beam", 2, "--max-new-tokens", 3, "--src", marian["src"])
    assert short.returncode == 0 and short.stdout.splitlines() == marian["expected"]["max-len 3"], short.stderr


@pytest.mark.extra("transformers", "bench")
@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_a_marian_folder_answers_each_typed_line(marian):
    texts = marian["texts"][:3]

    def type_lines(write, read_answer):
        answers = []
        for sentence in texts:
            write(sentence.encode("utf-8") + b"\n")
            answers.append(read_answer())
        return answers

    answers, err = _on_a_terminal(marian["folder"], 1, type_lines)
    assert "Ctrl-D" in err and "error" not in err
    assert answers == marian["expected"][1][:3]


def _marian_tokenizer_folder(path, drop=None):
    """A Marian folder's config.json and tokenizer files, ``drop`` deleted (no weights: the tokenizer's files
    are checked before the weights are read)."""
    pytest.importorskip("sentencepiece")
    from tests.marian_files import write_tokenizer_files

    write_tokenizer_files(path)
    (path / "config.json").write_text(json.dumps({"model_type": "marian"}))
    if drop:
        (path / drop).unlink()
    return path


@pytest.mark.parametrize("name", ["vocab.json", "source.spm", "target.spm"])
def test_a_marian_folder_without_a_tokenizer_file_is_one_line(tmp_path, capsys, monkeypatch, name):
    folder = _marian_tokenizer_folder(tmp_path / "opus", drop=name)
    code, err, out = translate(["--checkpoint", folder], capsys, b"Hallo\n", monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and out == "" and f"{folder} has no {name}" in line and "copy them from" in line


def test_a_gpt2_folder_given_to_translate_names_generate(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    code, err, out = translate(["--checkpoint", folder], capsys, b"Hallo\n", monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 2 and out == ""
    assert f"{folder} is a Hugging Face GPT-2 folder (a language model), not a translation model" in line
    assert f"python -m minitf.generate --checkpoint {folder}" in line


@pytest.mark.parametrize("flag", ["--from-pretrained", "--checkpoint"])
def test_a_marian_folder_given_to_generate_names_translate(tmp_path, capsys, flag):
    from minitf.lm.generate import main as generate_main

    folder = _marian_tokenizer_folder(tmp_path / "opus")
    assert generate_main([flag, str(folder), "--prompt", "Hallo"]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err.strip().splitlines(), "minitf.generate")
    assert captured.out == "" and f"{folder} is a Hugging Face Marian folder (a translation model)" in line
    assert f"python -m minitf.translate --checkpoint {folder}" in line


@pytest.mark.extra("transformers", "bench")
def test_tokenizer_files_of_another_model_are_one_line(marian, tmp_path, capsys, monkeypatch):
    """A vocab.json with ids beyond the model's vocabulary (another model's files copied in) is refused
    before any sentence is translated, naming the file."""
    folder = tmp_path / "mixed"
    shutil.copytree(marian["folder"], folder)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    vocab["▁extra"] = len(vocab) + 10
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    code, err, out = translate(["--checkpoint", folder], capsys, b"Hallo\n", monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and out == "" and f"{folder / 'vocab.json'} has ids up to {len(vocab) + 9}" in line


def _copy_changed(marian, tmp_path, name, change):
    """A copy of the Marian folder with its JSON file ``name`` changed by ``change(values)``."""
    folder = tmp_path / "changed"
    shutil.copytree(marian["folder"], folder)
    values = json.loads((folder / name).read_text(encoding="utf-8"))
    change(values)
    (folder / name).write_text(json.dumps(values), encoding="utf-8")
    return folder


def _swap(vocab, token, other_id):
    """vocab.json with ``token`` and the piece of ``other_id`` exchanging their ids."""
    other = next(piece for piece, i in vocab.items() if i == other_id)
    vocab[token], vocab[other] = other_id, vocab[token]


@pytest.mark.extra("transformers", "bench")
@pytest.mark.parametrize("case, name, change, words", [
    ("vocab.json's <pad> another id", "vocab.json", lambda v: _swap(v, "<pad>", 5), "pad_token_id"),
    ("vocab.json's </s> another id", "vocab.json", lambda v: _swap(v, "</s>", 5), "eos_token_id"),
    ("tokenizer_config.json's pad_token another token", "tokenizer_config.json",
     lambda c: c.update(pad_token="<unk>"), "pad_token_id"),
])
def test_tokenizer_files_whose_pad_or_eos_is_not_the_models_are_one_line(marian, tmp_path, capsys, monkeypatch,
                                                                        case, name, change, words):
    """The same check as ``train.py --init-from`` (tests/test_marian_finetune.py): the tokenizer's pad or eos id
    not config.json's is refused before any sentence is translated; before, translate padded with the tokenizer's
    id while the model masked config.json's, and printed wrong translations with exit 0."""
    import minitf
    from minitf.training.errors import DataError
    folder = _copy_changed(marian, tmp_path, name, change)
    code, err, out = translate(["--checkpoint", folder], capsys, b"Ich habe Hunger .\n", monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and out == "" and f"config.json's {words}" in line and "tokenizer" in line, line
    with pytest.raises(DataError, match=words):  # every command's loader: inspect, export's --checkpoint too
        minitf.load(folder)


@pytest.mark.parametrize("name", ["source.spm", "target.spm"])
@pytest.mark.parametrize("content", [b"", b"\x08\x01garbage"])
def test_an_empty_or_damaged_sentencepiece_file_is_one_line_naming_it(tmp_path, capsys, monkeypatch, name, content):
    """Refused when the tokenizer is read: before, an empty source.spm ended translate in a 34-line traceback
    ("Model is not initialized") at encoding time and an empty target.spm was accepted without a word."""
    folder = _marian_tokenizer_folder(tmp_path / "opus")
    (folder / name).write_bytes(content)
    code, err, out = translate(["--checkpoint", folder], capsys, b"Hallo\n", monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and out == "" and f"{folder / name} is " in line and "sentencepiece model" in line, line


@pytest.mark.extra("transformers", "bench")
@pytest.mark.parametrize("key", ["attention_dropout", "activation_dropout", "encoder_layerdrop"])
def test_a_training_only_dropout_is_no_reason_to_refuse_translating(marian, tmp_path, capsys, monkeypatch, key):
    """Dropout is off when translating: a folder whose config.json sets attention_dropout (or another dropout
    that acts only in training) above 0 translates as the same folder without it; before, it was refused.
    (Fine-tuning refuses it: tests/test_marian_finetune.py.)"""
    folder = _copy_changed(marian, tmp_path, "config.json", lambda c: c.update({key: 0.1}))
    code, err, out = translate(["--checkpoint", folder, "--src", marian["src"]], capsys)
    assert code == 0 and out.splitlines() == marian["expected"][4], err


@pytest.mark.extra("transformers", "bench")
def test_translate_reads_a_marian_folder_without_the_safetensors_package(marian, tmp_path, capsys, monkeypatch):
    """minitf reads model.safetensors with its own reader: the hf extra is no longer needed to translate."""
    for module in ("safetensors", "safetensors.numpy"):
        monkeypatch.setitem(sys.modules, module, None)  # its import raises ImportError, installed or not
    code, err, out = translate(["--checkpoint", marian["folder"], "--src", marian["src"]], capsys)
    assert code == 0 and out.splitlines() == marian["expected"][4], err

# --------------------------------------------------------------------------- the model's positions
def test_a_line_longer_than_the_runs_max_len_is_refused_naming_the_line(tiny_run, tmp_path, capsys, monkeypatch):
    """A run trained with --max-len 100 (the default): a line of more tokens with its </s> is refused in one
    line naming the line and the limit, before anything is translated (it was translated from positions the
    model never saw); a --max-len past the positions less the start token is refused too."""
    long_line = ("der hund " * 60).strip()
    code, err, out = translate(["--checkpoint", tiny_run["run"], "--beam", 1], capsys,
                               f"Der hund.\n\n{long_line}\n".encode(), monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and out == "" and "standard input: line 3 has " in line
    assert "tokens with its </s>, longer than the model's context of 100 (its training's cap, --max-len" in line
    source = tmp_path / "src.txt"
    source.write_text(f"{long_line}\n", encoding="utf-8")
    code, err, out = translate(["--checkpoint", tiny_run["run"], "--src", source], capsys)
    assert code == 1 and out == "" and f"--src {source}: line 1 has " in one_error_line(err, "minitf.translate")
    code, err, out = translate(["--checkpoint", tiny_run["run"], "--max-new-tokens", 100], capsys, b"Der hund.\n",
                               monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 2 and out == "" and "--max-new-tokens 100 does not fit the model's context of 100" in line
    assert "use at most 99" in line
    code, err, out = translate(["--checkpoint", tiny_run["run"], "--max-new-tokens", 99], capsys, b"Der hund.\n",
                               monkeypatch, tmp_path)
    assert code == 0 and len(out.splitlines()) == 1, err
    # the old spelling, kept one release: the same value, and one line saying the new one
    code, err, out = translate(["--checkpoint", tiny_run["run"], "--max-len", 99], capsys, b"Der hund.\n",
                               monkeypatch, tmp_path)
    assert code == 0 and len(out.splitlines()) == 1, err
    assert [line for line in err if line.startswith("note:")] == [
        "note: --max-len is now --max-new-tokens (the old spelling goes in the next release)"], err


@pytest.mark.extra("transformers", "bench")
def test_a_marian_folder_refuses_a_line_past_its_positions_as_transformers_does(marian, tmp_path, capsys,
                                                                                  monkeypatch):
    """The folder's 64 positions (max_position_embeddings): a line of 64 tokens with its </s> is translated,
    one of 65 refused in one line naming the line and the limit (transformers raises an IndexError on it);
    --max-len 64 (past 64 less the start token) is refused; an output never passes 63 tokens."""
    import torch
    import transformers

    from minitf.nmt.marian_tokenizer import MarianTokenizer
    tokenizer = MarianTokenizer.from_folder(marian["folder"])
    word = "Hund"
    per_word = len(tokenizer.encode([word])[0])
    fits = " ".join([word] * (63 // per_word))
    while len(tokenizer.encode([fits])[0]) < 63:
        fits += "."
    assert len(tokenizer.encode([fits])[0]) == 63 and len(tokenizer.encode([fits + "."])[0]) == 64
    hf = transformers.MarianMTModel.from_pretrained(str(marian["folder"])).eval()
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(str(marian["folder"]))
    with torch.no_grad():
        hf.generate(**hf_tokenizer([fits], return_tensors="pt"), max_length=20)
        with pytest.raises(IndexError):
            hf.generate(**hf_tokenizer([fits + "."], return_tensors="pt"), max_length=20)
    code, err, out = translate(["--checkpoint", marian["folder"], "--beam", 1], capsys, f"{fits}\n".encode(),
                               monkeypatch, tmp_path)
    assert code == 0 and len(out.splitlines()) == 1, err
    code, err, out = translate(["--checkpoint", marian["folder"]], capsys, f"Hallo\n{fits}.\n".encode(),
                               monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and out == "" and "standard input: line 2 has 65 tokens with its </s>" in line
    assert "longer than the model's context of 64 (its position table, max_position_embeddings)" in line
    code, err, out = translate(["--checkpoint", marian["folder"], "--max-new-tokens", 64], capsys, b"Hallo\n",
                               monkeypatch, tmp_path)
    assert code == 2 and "use at most 63" in one_error_line(err, "minitf.translate")


@pytest.mark.parametrize("flags, named", [(["--max-new-tokens", 99999999998, "--beam", 1], "--max-new-tokens"),
                                           (["--beam", 10 ** 12, "--max-new-tokens", 8], "--beam")])
@pytest.mark.extra("safetensors", "hf")
def test_out_of_memory_names_the_setting_that_drove_it(tmp_path, capsys, monkeypatch, flags, named):
    """A Marian folder of 99,999,999,999 positions (minitf's own writer: no torch) lets --max-new-tokens 99999999998 pass
    the context check: decoding one sentence greedily then asks for 745 GiB, and the line said "use a smaller
    --batch-size or --beam", neither of which can help. It names the setting whose value drove the arrays
    (sentences x beams x output tokens), and says the numbers."""
    pytest.importorskip("sentencepiece")
    from tests.marian_files import minitf_marian_folder

    folder = tmp_path / "opus"
    minitf_marian_folder(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 99999999999}))
    code, err, out = translate(["--checkpoint", folder, *flags], capsys, b"Der Hund.\n", monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and out == "" and "out of memory" in line and line.endswith(f"use a smaller {named}"), line
    others = {"--max-new-tokens", "--beam", "--batch-size"} - {named}
    assert not any(f"smaller {flag}" in line or f"or {flag}" in line for flag in others), line


def test_the_driver_of_decodings_memory_is_the_setting_far_above_its_usual_size():
    """Sentences against 64, beams against 4, the output cap against source length + 50: the one more than twice
    its usual size is named; none, and the hint names --batch-size or --beam as before."""
    from minitf.nmt.decode import DecodingOutOfMemory
    from minitf.nmt.translate import memory_hint

    cases = {(100000, 4, 60, 10): "--batch-size", (1, 64, 60, 10): "--beam", (1, 1, 10 ** 11, 5): "--max-new-tokens",
             (64, 4, 60, 10): "--batch-size or --beam", (100, 6, 100, 30): "--batch-size or --beam"}
    for (sentences, beam, steps, source), flag in cases.items():
        error = DecodingOutOfMemory(MemoryError("Unable to allocate"), sentences, beam, steps, source)
        assert memory_hint(error) == f"use a smaller {flag}", (sentences, beam, steps, source)
        assert f"decoding {sentences} sentence" in str(error) and f"outputs of up to {steps} tokens" in str(error)
    assert memory_hint(MemoryError()) == "use a smaller --batch-size or --beam"


def test_the_trainers_validation_says_how_many_sentences_were_cut_to_its_max_len(tmp_path, capsys):
    """A run of --max-len 14 whose validation and test sentences are mostly longer: the run does not stop at its
    end (its BLEU cannot refuse them), and each BLEU line says how many were cut to its positions and what to do."""
    from tests.runs import make_corpus
    from minitf.nmt.data import Corpus, read_splits
    from minitf.nmt.translation_trainer import load_tokenizer

    corpus = make_corpus(tmp_path)
    code, err = train(corpus + TINY + ["--max-steps", "4", "--eval-every", "4", "--save-every", "4", "--max-len", "14",
                                       "--out", tmp_path / "run"], capsys)
    assert code == 0, err
    paths = dict(zip((flag[2:].replace("-", "_") for flag in corpus[::2]), corpus[1::2]))
    texts = Corpus(load_tokenizer(tmp_path / "run" / "tokenizer.model"), read_splits(paths), log=lambda line: None)
    longer = {split: int((texts.lengths(split)[0] > 14).sum()) for split in ("valid", "test")}
    assert 0 < longer["valid"] < 12 or 0 < longer["test"] < 12, longer  # a count the test can tell from all
    for split in ("valid", "test"):
        lines = [line for line in err if f" {split}: " in line and "BLEU" in line and "(12 sentences" in line]
        assert lines and all(f"({longer[split]} longer than --max-len 14 tokens were cut to it: raise --max-len"
                             in line for line in lines), err
