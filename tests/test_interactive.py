"""Interactive translation under a pseudo-terminal: each line is answered as soon
as it is typed (before the next one is sent), and the answers equal the batched
translation of a pipe; the end of train.py shows the command and examples."""
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from minitf.nmt.trainer import EVERYDAY_GERMAN
from minitf.nmt.train import main as train_main
from tests.runs import ROOT, TINY

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from tests.runs import make_corpus
    folder = tmp_path_factory.mktemp("interactive")
    run = folder / "run"
    assert train_main(make_corpus(folder) + TINY + ["--max-steps", "30", "--eval-every", "100", "--save-every", "30",
                                                    "--out", str(run)]) == 0
    return run


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _read_line(fd, timeout=60):
    """One line from a pipe, or fail after ``timeout`` seconds."""
    data, deadline = b"", time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, f"no answer within {timeout} s (got {data!r})"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1)
            assert chunk, f"the command closed its output after {data!r}"
            data += chunk
    return data.decode("utf-8").rstrip("\n")


def test_each_line_is_answered_as_it_is_typed(tiny_run):
    sentences = ["Der hund sieht ein haus.", "Die katze mag den vogel.", "Ein kleine baum."]
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "minitf.translate", "--checkpoint", str(tiny_run),
                                "--beam", "2"], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=ROOT, env=_env())
    os.close(slave)
    try:
        answers = []
        for sentence in sentences:  # the next line is typed only after the answer to this one came
            os.write(master, sentence.encode("utf-8") + b"\n")
            answers.append(_read_line(process.stdout.fileno()))
        os.write(master, b"\n")  # an empty line gets an empty answer
        assert _read_line(process.stdout.fileno()) == ""
        os.write(master, b"\x04")  # Ctrl-D: end of input on a terminal
        assert process.wait(timeout=60) == 0
        err = process.stderr.read().decode()
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    assert "Ctrl-D" in err and "error" not in err
    assert all(answers), answers
    batched = subprocess.run([sys.executable, "-m", "minitf.translate", "--checkpoint", str(tiny_run), "--beam", "2"],
                             input="\n".join(sentences) + "\n", capture_output=True, text=True, cwd=ROOT, env=_env(),
                             timeout=120)
    assert batched.returncode == 0 and batched.stdout.splitlines() == answers


def test_end_of_training_shows_the_command_and_everyday_sentences(tiny_run, tmp_path, capsys):
    from tests.runs import make_corpus
    run = tmp_path / "run"
    assert train_main(make_corpus(tmp_path) + TINY + ["--max-steps", "3", "--eval-every", "100",
                                                      "--out", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"python -m minitf.translate --checkpoint {run}" in err
    assert all(f"  {sentence}" in err for sentence in EVERYDAY_GERMAN)
    assert err.count("  ->  ") == len(EVERYDAY_GERMAN)
