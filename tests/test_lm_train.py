"""``train.py --model gpt``: a language model trained by the shared trainer (the same update, loop,
checkpoints, resume and errors as translation): it learns, a killed run resumes exactly, 2 ranks equal one
process, and bad input is one line."""
import dataclasses
import json
import signal
import subprocess
import sys
import time

import pytest

from minitf.backend import host as np
from minitf.training import checkpoint as ckpt
from minitf.train import main as train_main
from tests.runs import CPU_ENV, ROOT, change_manifest, final_params, metrics, needs_mpi, one_error_line, train_py

#: A tiny GPT over characters: seconds per run on this machine.
TINY_GPT = ["--model", "gpt", "--tokenizer", "char", "--d-model", "24", "--num-heads", "2", "--num-layers", "2",
            "--d-ff", "48", "--block-size", "24", "--max-tokens", "192", "--warmup", "10", "--lr-scale", "0.3",
            "--no-progress", "--seed", "5"]


def make_text(folder, lines=300, seed=0):
    """A repetitive little language (learnable in a few dozen steps): train, valid and test files."""
    rng = np.random.default_rng(seed)
    words = ["the cat", "a dog", "sees", "likes", "the red ball", "a small bird", "and", "runs home"]
    text = ["%s %s %s." % tuple(words[i] for i in rng.integers(0, len(words), 3)) for _ in range(lines)]
    paths = {}
    for split, part in (("train", text[:240]), ("valid", text[240:270]), ("test", text[270:])):
        paths[split] = folder / f"{split}.txt"
        paths[split].write_text("\n".join(part) + "\n", encoding="utf-8")
    return ["--train-text", str(paths["train"]), "--valid-text", str(paths["valid"]),
            "--test-text", str(paths["test"])]


def test_a_gpt_run_learns_on_a_tiny_text(tmp_path, capsys):
    argv = make_text(tmp_path) + TINY_GPT + ["--max-steps", "60", "--eval-every", "20", "--save-every", "20",
                                             "--out", str(tmp_path / "run")]
    assert train_main(argv) == 0
    err = capsys.readouterr().err
    valid = metrics(tmp_path / "run", "valid")
    assert [r["step"] for r in valid] == [20, 40, 60]
    assert valid[-1]["loss"] < valid[0]["loss"] - 0.3, valid
    assert all(r["bpc"] > 0 and r["ppl"] == pytest.approx(np.exp(r["loss"]), rel=1e-3) for r in valid)
    assert "bits/char" in err and "sample: " in err and "test loss" in err
    test = metrics(tmp_path / "run", "test")
    assert len(test) == 1 and test[0]["loss"] < valid[0]["loss"]
    assert json.loads((tmp_path / "run" / "best.json").read_text())["model"] == "last"
    model = ckpt.read_checkpoint(ckpt.checkpoint_path(tmp_path / "run", 60))["meta"]["model"]
    assert model["pre_norm"] and model["activation"] == "gelu_tanh" and model["positions"] == "learned"  # GPT-2's


def test_the_bpe_tokenizer_trains_a_gpt_too(tmp_path, capsys):
    argv = make_text(tmp_path) + [a for a in TINY_GPT if a not in ("--tokenizer", "char")] + [
        "--vocab-size", "60", "--max-steps", "4", "--eval-every", "4", "--out", str(tmp_path / "run")]
    assert train_main(argv) == 0
    assert "bpe vocabulary of 60" in capsys.readouterr().err
    assert [r["step"] for r in metrics(tmp_path / "run", "valid")] == [4]


def _train_steps(run):
    path = run / "metrics.jsonl"
    return sum('"kind": "train"' in line for line in path.read_text().splitlines()) if path.is_file() else 0


def test_the_command_checks_a_gpt_run_in_its_own_default_folder(tmp_path):
    """``python train.py --model gpt`` without --out trains into runs/gpt-tiny: beside a translation run in
    runs/tiny (its default folder) it starts; the command's check before the ranks looked at runs/tiny and
    refused it ("--out runs/tiny already holds a run")."""
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "runs" / "tiny" / "config.json").write_text("{}")
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *make_text(tmp_path), *TINY_GPT,
                             "--max-steps", "1", "--eval-every", "1", "--average", "0"], cwd=tmp_path,
                            env=dict(CPU_ENV, MINITF_RANKS="1"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "runs" / "gpt-tiny" / "config.json").is_file()
    assert (tmp_path / "runs" / "tiny" / "config.json").read_text() == "{}"


def test_a_killed_gpt_run_resumed_equals_an_uninterrupted_run(tmp_path):
    """SIGKILL during training, then --resume: the final parameters, Adam's moments and the metrics equal
    those of a run never killed (batches depend on (seed, epoch, batch), dropout on (seed, step))."""
    steps = 16
    argv = make_text(tmp_path) + TINY_GPT + ["--max-steps", str(steps), "--save-every", "2", "--eval-every", "5",
                                             "--keep", "20"]
    ref, run = tmp_path / "ref", tmp_path / "killed"
    assert train_main(argv + ["--out", str(ref)]) == 0
    slow = dict(CPU_ENV, MINITF_TEST_SLOW_CHECKPOINT="0.05")  # slower saves: the kill lands before the end
    proc = subprocess.Popen([sys.executable, "train.py", *argv, "--out", str(run)], cwd=ROOT, env=slow,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and _train_steps(run) < 7:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it was killed"
    assert 7 <= _train_steps(run) < steps
    assert train_main(["--resume", str(run), "--no-progress"]) == 0
    a = ckpt.read_checkpoint(ckpt.checkpoint_path(ref, steps))
    b = ckpt.read_checkpoint(ckpt.checkpoint_path(run, steps))
    for name in a["params"]:
        np.testing.assert_array_equal(a["params"][name], b["params"][name])
    for key in ("m", "v"):
        np.testing.assert_array_equal(a["optimizer"][key], b["optimizer"][key])
    keys = ("kind", "step", "epoch", "loss", "ppl", "lr", "tokens", "bpc")

    def log(run_dir):
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: r.get(k) for k in keys} for r in records if r["kind"] != "done"]

    assert log(run) == log(ref)


def test_ctrl_c_saves_a_gpt_checkpoint_and_a_prepared_run_resumes_from_it(tmp_path):
    """Ctrl-C during a --corpus-dir run: a checkpoint of the step reached, exit 130, one line saying how to
    continue; --resume (the prepared folder mapped again) then ends where an uninterrupted run ends."""
    text = make_text(tmp_path)
    common = TINY_GPT + ["--corpus-dir", str(tmp_path / "prepared"), "--eval-every", "1000", "--save-every", "1000"]
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", *text, *common, "--max-steps", "100000", "--out", str(run)],
                            cwd=ROOT, env=CPU_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and _train_steps(run) < 3:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    step = int(err.split("stopped at step ")[1].split(";")[0])
    assert step >= 3 and f"python train.py --resume {run}" in err
    assert ckpt.read_checkpoint(ckpt.checkpoint_path(run, step))["meta"]["step"] == step
    assert train_main(["--resume", str(run), "--max-steps", str(step + 3), "--no-progress"]) == 0
    ref = tmp_path / "ref"
    assert train_main(common + ["--max-steps", str(step + 3), "--out", str(ref)]) == 0
    np.testing.assert_array_equal(_params(run), _params(ref))
    assert [r["step"] for r in metrics(run)] == list(range(1, step + 4))


def test_a_gpt_trains_in_fp16_with_a_loss_scale(tmp_path):
    """--precision fp16: a float16 GPT, float32 master weights, the dynamic loss scale in the metrics; it learns,
    and the checkpoint holds the float32 master weights."""
    argv = make_text(tmp_path) + TINY_GPT + ["--precision", "fp16", "--max-steps", "40", "--eval-every", "20",
                                             "--save-every", "40", "--out", str(tmp_path / "run")]
    assert train_main(argv) == 0
    train = metrics(tmp_path / "run")
    assert len(train) == 40 and all("loss_scale" in r for r in train)
    valid = metrics(tmp_path / "run", "valid")
    assert valid[-1]["loss"] < valid[0]["loss"]
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(tmp_path / "run", 40))
    assert {a.dtype for a in state["params"].values()} == {np.dtype("float32")}


@needs_mpi
def test_two_ranks_train_the_gpt_as_one_process(tmp_path):
    """2 ranks of mpiexec, dropout 0, 20 steps: the parameters equal one process's (float32 sums in
    another order: relative 1e-4), and so do 2 ranks with half batches, --accumulate 2 and --zero 1."""
    common = make_text(tmp_path) + TINY_GPT + ["--dropout", "0", "--max-steps", "20", "--save-every", "20",
                                               "--eval-every", "20"]
    halves = common + ["--max-tokens", "96", "--accumulate", "2", "--zero", "1"]  # the last --max-tokens wins
    runs = {"one": train_py(*common, "--out", tmp_path / "one"),
            "two": train_py(*common, "--out", tmp_path / "two", ranks=2),
            "zero": train_py(*halves, "--out", tmp_path / "zero", ranks=2)}
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr[-2000:])
    assert "data parallel: 2 ranks" in runs["two"].stderr and "ZeRO-1" in runs["zero"].stderr
    step, one = final_params(tmp_path / "one")  # without the attention key biases (their true gradient is 0)
    assert step == 20
    for name in ("two", "zero"):
        step, other = final_params(tmp_path / name)
        assert step == 20 and np.linalg.norm(one - other) <= 1e-4 * np.linalg.norm(one), name


def _write(path, data):
    path.write_bytes(data)
    return str(path)


# name: (argv from (tmp folder, a good command line), exit status, words of the one error line)
BAD_LM_INPUTS = {
    "missing text": (lambda d, c: c + ["--train-text", str(d / "nope.txt")], 1, "does not exist"),
    "empty text": (lambda d, c: c + ["--valid-text", _write(d / "empty.txt", b"")], 1, "is empty (0 bytes)"),
    "blank text": (lambda d, c: c + ["--valid-text", _write(d / "blank.txt", b" \n\n ")], 1, "has no text"),
    "invalid utf-8": (lambda d, c: c + ["--train-text", _write(d / "latin1.txt", "Straße\n".encode("latin-1") * 50)],
                      1, "is not valid UTF-8 at line 1"),
    "directory": (lambda d, c: c + ["--train-text", str(d)], 1, "is a directory"),
    "text shorter than a block": (lambda d, c: c + ["--train-text", _write(d / "short.txt", b"abc\n")],
                                  1, "fewer than the 25 it needs"),
    "no valid text": (lambda d, c: [a for a in c if a != c[c.index("--valid-text") + 1] and a != "--valid-text"],
                      2, "needs --valid-text FILE too"),
    "a valid text without a training text": (lambda d, c: [a for a in c if a != c[c.index("--train-text") + 1]
                                                            and a != "--train-text"],
                                             2, "--valid-text and --test-text go with --train-text FILE"),
    "translation flags": (lambda d, c: c + ["--train-src", "x.de"], 2, "--train-src belong to translation"),
    "text without --model gpt": (lambda d, c: c[c.index("--train-text"):c.index("--train-text") + 2],
                                 2, "--train-text belong to the language model"),
    "translation preset": (lambda d, c: c + ["--preset", "base"], 2, "unknown preset 'base' for --model gpt"),
    "unknown tokenizer": (lambda d, c: c + ["--tokenizer", "words"], 2, "invalid choice: 'words'"),
    "zero block": (lambda d, c: c + ["--block-size", "0"], 2, "argument --block-size: expected a positive int"),
    "vocabulary too large": (lambda d, c: [a for a in c if a not in ("--tokenizer", "char")] + ["--vocab-size", "5000"],
                             1, "vocab size 5000 is too large"),
}


@pytest.mark.parametrize("case", sorted(BAD_LM_INPUTS))
def test_bad_language_model_input_is_one_line(tmp_path, capsys, case):
    make_argv, status, words = BAD_LM_INPUTS[case]
    good = make_text(tmp_path) + TINY_GPT + ["--max-steps", "1", "--out", str(tmp_path / "run")]
    try:
        got = train_main(make_argv(tmp_path, good))
    except SystemExit as stop:  # argparse's usage errors
        got = stop.code
    assert got == status
    line = one_error_line(capsys.readouterr().err.splitlines())
    assert words in line, line
    assert not (tmp_path / "run").exists() or not (tmp_path / "run" / "config.json").exists()


def _params(run_dir):
    state = ckpt.read_checkpoint(ckpt.list_checkpoints(run_dir)[-1])
    return np.concatenate([np.ravel(a) for _, a in sorted(state["params"].items())])


def test_a_text_prepared_into_token_arrays_trains_as_the_text_itself(tmp_path, capsys):
    """--corpus-dir: the text prepared once into memory-mapped ids (then reused, also without the text
    flags) trains the same model, step for step, as the text read into memory."""
    text = make_text(tmp_path)
    common = TINY_GPT + ["--max-steps", "8", "--eval-every", "4", "--save-every", "8"]
    prepared = tmp_path / "prepared"
    assert train_main(text + common + ["--out", str(tmp_path / "memory")]) == 0
    assert train_main(text + common + ["--corpus-dir", str(prepared), "--out", str(tmp_path / "mapped")]) == 0
    assert "prepared train: " in capsys.readouterr().err
    assert train_main(text + common + ["--corpus-dir", str(prepared), "--out", str(tmp_path / "reused")]) == 0
    assert "reused (its manifest matches" in capsys.readouterr().err
    assert train_main(common + ["--corpus-dir", str(prepared), "--out", str(tmp_path / "folder-only")]) == 0
    keys = ("step", "loss", "ppl", "bpc", "tokens")
    expected = [{k: r[k] for k in keys} for r in metrics(tmp_path / "memory", "valid")]
    for run in ("mapped", "reused", "folder-only"):
        assert [{k: r[k] for k in keys} for r in metrics(tmp_path / run, "valid")] == expected, run
        np.testing.assert_array_equal(_params(tmp_path / run), _params(tmp_path / "memory"))
    config = json.loads((tmp_path / "folder-only" / "config.json").read_text())
    assert config["data"] == {"prepared": str(prepared.resolve())} and config["tokenizer"] == "char"


def _damage(name, data=None, cut=None):
    def damage(folder):
        path = folder / name
        if cut is not None:
            path.write_bytes(path.read_bytes()[:cut])
        else:
            path.write_bytes(data)
    return damage


# name: (what is done to a good prepared folder, whether the text flags are given too, words of the one line)
BAD_PREPARED_TEXTS = {
    "truncated ids": (_damage("train.bin", cut=100), False, "bytes, its manifest says"),
    "an id outside the vocabulary": (lambda folder: (folder / "valid.bin").write_bytes(
        b"\xff" * (folder / "valid.bin").stat().st_size), False, "outside the vocabulary"),
    "another tokenizer": (_damage("tokenizer.model", data=b'{"format": "minitf-char-1", "chars": "ab"}'), False,
                          "is not the tokenizer its manifest names"),
    "a translation corpus's manifest": (change_manifest(lambda m: m.update(kind=None)), False, "not a translation corpus"),
    "manifest not JSON": (_damage("manifest.json", data=b"{nope"), False, "is not valid JSON"),
    "made from another text": (lambda folder: None, "other", "was made from other sources"),
    "no manifest": (lambda folder: (folder / "manifest.json").unlink(), "same", "is not empty and holds no prepared"),
}


@pytest.mark.parametrize("case", sorted(BAD_PREPARED_TEXTS))
def test_a_bad_prepared_text_is_one_line(tmp_path, capsys, case):
    damage, with_text, words = BAD_PREPARED_TEXTS[case]
    text = make_text(tmp_path)
    prepared = tmp_path / "prepared"
    common = TINY_GPT + ["--max-steps", "1", "--corpus-dir", str(prepared)]
    assert train_main(text + common + ["--out", str(tmp_path / "good")]) == 0
    capsys.readouterr()
    damage(prepared)
    argv = common + ["--out", str(tmp_path / "run")]
    if with_text == "other":
        (tmp_path / "valid.txt").write_text("another validation text\n" * 5, encoding="utf-8")
    if with_text:
        argv = text + argv
    got = train_main(argv)
    line = one_error_line(capsys.readouterr().err.splitlines())
    assert got == 1 and words in line, line
    assert not (tmp_path / "run" / "config.json").exists()
    if case in ("made from another text", "truncated ids"):  # --prepare-again replaces it
        again = text + common + ["--prepare-again", "--out", str(tmp_path / "again")]
        assert train_main(again) == 0
        assert metrics(tmp_path / "again", "train")


def test_a_gpt_checkpoint_loads_into_the_model_its_config_describes(tmp_path):
    """A run's checkpoint (meta.json's config, tokenizer.model, model.npz) is all a sampler needs: the GPT built by
    gpt_from_run_config from its config takes its parameters and has the shape the run recorded."""
    from minitf.lm.data import CharTokenizer
    from minitf.lm.trainer import gpt_from_run_config
    assert train_main(make_text(tmp_path) + TINY_GPT + ["--max-steps", "3", "--out", str(tmp_path / "run")]) == 0
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(tmp_path / "run", 3))
    tokenizer = CharTokenizer.from_bytes((ckpt.checkpoint_path(tmp_path / "run", 3) / "tokenizer.model").read_bytes())
    model = gpt_from_run_config(state["meta"]["config"], tokenizer.vocab_size)
    model.load_state_dict(state["params"])
    assert dataclasses.asdict(model.config) == state["meta"]["model"]


def test_generate_continues_a_prompt_from_a_gpt_run_and_each_command_refuses_the_others_run(tmp_path):
    """`python -m minitf.generate --checkpoint RUN` samples from a --model gpt run (greedy: the model's own
    continuation, line breaks and all); translate refuses that run and generate a translation run, in one line."""
    from minitf.sampling import generate
    from minitf.lm.data import TextTokenizer
    from tests.runs import TINY, make_corpus
    run, translation = tmp_path / "run", tmp_path / "translation"
    assert train_main(make_text(tmp_path) + TINY_GPT + ["--max-steps", "3", "--out", str(run)]) == 0
    command = [sys.executable, "-m", "minitf.generate", "--checkpoint", str(run), "--prompt", "the cat",
               "--temperature", "0", "--max-new-tokens", "12"]
    done = subprocess.run(command, capture_output=True, text=True, env=CPU_ENV, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    model, tokenizer, _ = ckpt.load_model(run)
    tokenizer = TextTokenizer(tokenizer)
    ids = tokenizer.encode(["the cat"])[0]
    expected = tokenizer.decode([generate(model, np.asarray([ids]), 12, temperature=0.0)[0].tolist()])[0]
    assert done.stdout == expected + "\n" and done.stdout.startswith("the cat") and len(expected) > len("the cat")
    refused = subprocess.run([sys.executable, "-m", "minitf.translate", "--checkpoint", str(run)], input="Hallo\n",
                             capture_output=True, text=True, env=CPU_ENV, cwd=ROOT, timeout=120)
    assert refused.returncode == 1 and f"python -m minitf.generate --checkpoint {run}" in one_error_line(
        refused.stderr.splitlines(), "minitf.translate", lines=3), refused.stderr
    assert train_main(make_corpus(tmp_path) + TINY + ["--max-steps", "2", "--out", str(translation)]) == 0
    refused = subprocess.run(command[:4] + [str(translation)] + command[5:], capture_output=True, text=True,
                             env=CPU_ENV, cwd=ROOT, timeout=120)
    assert refused.returncode == 1 and f"python -m minitf.translate --checkpoint {translation}" in one_error_line(
        refused.stderr.splitlines(), "minitf.generate", lines=3), refused.stderr
