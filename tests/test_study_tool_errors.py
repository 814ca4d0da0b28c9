"""The study tools on a learner's mistakes, through the real commands: ``python -m
minitf.gradcheck FILE.py:NAME``, ``python -m minitf.exercise`` and ``python -m minitf.trace``.
A file that does not run, a name that is no layer, a constructor, forward or backward that
raises, too few ``--shape`` or a zero-size one, a backward that never ends: one line on stderr
(the learner's exception with its last frame in the learner's file), a non-zero exit and no
traceback. Ctrl-C during a check is one line too, and output cut short by ``| head`` ends quietly."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.runs import CPU_ENV, ROOT

LAYERS = '''import minitf
from minitf import backend

NOT_A_LAYER = 3


class Scale(minitf.Module):
    def forward(self, x):
        self.save_for_backward(x)
        return 2 * x

    def backward(self, dy):
        return 2 * dy


class NoWeights(minitf.Module):
    def __init__(self):
        raise RuntimeError("no weights yet")


class BadForward(Scale):
    def forward(self, x):
        return x @ backend.xp.ones((5, 5))


class BadBackward(Scale):
    def backward(self, dy):
        raise ValueError("dx is left for tomorrow")


class Forever(Scale):
    def backward(self, dy):
        while True:
            dy = dy + 0


def empty():
    return Scale(), backend.xp.zeros((0, 3))


class Product(minitf.Module):
    def forward(self, x, z):
        self.save_for_backward(x, z)
        return x * z

    def backward(self, dy):
        x, z = self.saved_tensors()
        return dy * z, dy * x
'''

LINEAR_LOOPS = '''import minitf
from minitf.exercises.linear import *
from minitf.exercises.linear import Linear as _Exercise

EXERCISE = "linear"


class Linear(_Exercise):
    def backward(self, dy):
        while True:
            dy = dy + 0
'''


def _line(text, snippet):
    """The line number of the one line of ``text`` holding ``snippet``."""
    (number,) = [i for i, line in enumerate(text.splitlines(), 1) if snippet in line]
    return number


def _files(tmp_path):
    files = {"layers": tmp_path / "layers.py", "broken": tmp_path / "broken.py", "loops": tmp_path / "my_linear.py",
             "noclass": tmp_path / "noclass.py", "listed": tmp_path / "listed.py", "afile": tmp_path / "afile.txt"}
    files["layers"].write_text(LAYERS)
    files["broken"].write_text('EXERCISE = "linear"\n\ndef forward(self, x:\n    return x\n')
    files["loops"].write_text(LINEAR_LOOPS)
    files["noclass"].write_text('EXERCISE = "linear"\n')
    files["listed"].write_text('EXERCISE = ["linear"]\n')
    files["afile"].write_text("not a directory\n")
    files["hangs"] = tmp_path / "hangs.py"
    files["hangs"].write_text('EXERCISE = "linear"\nwhile True:\n    pass\n')
    return files


#: (case, tool, argv from the files, exit status, words the one stderr line must hold)
CASES = [
    ("syntax-error", "gradcheck", lambda f: [f"{f['broken']}:forward"], 1,
     ["broken.py did not load: SyntaxError", "broken.py:3"]),
    ("not-callable", "gradcheck", lambda f: [f"{f['layers']}:NOT_A_LAYER"], 2,
     ["NOT_A_LAYER is a int, not a Module class"]),
    ("constructor-raises", "gradcheck", lambda f: [f"{f['layers']}:NoWeights"], 1,
     ["NoWeights() raised: RuntimeError: no weights yet", f"layers.py:{_line(LAYERS, 'no weights yet')} in __init__"]),
    ("forward-raises", "gradcheck", lambda f: [f"{f['layers']}:BadForward"], 1,
     ["the check failed: ValueError", f"layers.py:{_line(LAYERS, 'ones((5, 5))')} in forward"]),
    ("backward-raises", "gradcheck", lambda f: [f"{f['layers']}:BadBackward"], 1,
     ["the check failed: ValueError: dx is left for tomorrow",
      f"layers.py:{_line(LAYERS, 'left for tomorrow')} in backward"]),
    ("one-shape-for-two-inputs", "gradcheck", lambda f: [f"{f['layers']}:Product", "--shape", "2,3"], 2,
     ["Product.forward takes 2 inputs (x, z), --shape gave 1", "one --shape per input"]),
    ("zero-size-shape", "gradcheck", lambda f: [f"{f['layers']}:Scale", "--shape", "0,3"], 2,
     ["--shape 0,3: every size must be at least 1"]),
    ("zero-size-input-given", "gradcheck", lambda f: [f"{f['layers']}:empty"], 2,
     ["empty() gave an input with no entries (shapes (0, 3))", "nothing to check"]),
    ("backward-never-ends", "gradcheck", lambda f: [f"{f['layers']}:Forever", "--time-limit", "1"], 1,
     ["did not finish in 1 s", "layers.py:", "in backward: ", "--time-limit"]),
    ("exercise-syntax-error", "exercise", lambda f: ["check", f["broken"]], 1,
     ["broken.py did not load: SyntaxError"]),
    ("exercise-without-the-class", "exercise", lambda f: ["check", f["noclass"]], 2,
     ["defines no 'Linear'", "start linear"]),
    ("exercise-name-a-list", "exercise", lambda f: ["check", f["listed"]], 2, ["EXERCISE = ['linear']"]),
    ("start-to-a-file", "exercise", lambda f: ["start", "linear", "--to", f["afile"]], 2,
     ["afile.txt is a file"]),
    ("exercise-file-never-loads", "exercise", lambda f: ["check", f["hangs"], "--time-limit", "1"], 1,
     ["did not finish in 1 s", "hangs.py:"]),
    ("exercise-backward-never-ends", "exercise", lambda f: ["check", f["loops"], "--time-limit", "1"], 1,
     ["did not finish in 1 s", "my_linear.py:", "in backward: "]),
]


@pytest.mark.parametrize("tool, make_argv, status, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_learners_mistake_is_one_line(tmp_path, tool, make_argv, status, words):
    argv = [str(a) for a in make_argv(_files(tmp_path))]
    result = subprocess.run([sys.executable, "-m", f"minitf.{tool}", *argv], cwd=ROOT, env=CPU_ENV,
                            capture_output=True, timeout=60)
    err = result.stderr.decode().strip().splitlines()
    assert result.returncode == status and len(err) == 1, (result.returncode, err)
    assert all(word in err[0] for word in words), err[0]


def test_ctrl_c_during_a_check_is_one_line(tmp_path):
    files = _files(tmp_path)
    process = subprocess.Popen([sys.executable, "-m", "minitf.exercise", "check", str(files["loops"])], cwd=ROOT,
                               env=dict(CPU_ENV, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        assert b"exercise linear" in process.stdout.readline()  # the check has started
        time.sleep(1.0)                                         # and is in the loop
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    err = err.decode().strip().splitlines()
    assert process.returncode == 130 and len(err) == 1, (process.returncode, err)
    assert err[0].startswith("error: interrupted") and "my_linear.py:" in err[0] and "in backward" in err[0], err


@pytest.mark.parametrize("argv", [["minitf.trace", "--walk"], ["minitf.gradcheck", "model"],
                                  ["minitf.exercise", "list"]], ids=["trace-walk", "gradcheck", "exercise-list"])
def test_output_cut_short_by_a_closed_pipe_ends_quietly(argv):
    """``| head`` closes the pipe after a few lines; here it is closed before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=CPU_ENV, stdout=write,
                                stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write)
    assert result.stderr == b"" and result.returncode == 141, result.stderr.decode()[-500:]
