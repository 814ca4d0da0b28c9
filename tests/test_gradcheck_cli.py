"""The learner's command ``python -m minitf.gradcheck LAYER``: every layer passes,
and a deliberately wrong gradient is caught."""
import pytest

from minitf import gradcheck


@pytest.mark.parametrize("layer", gradcheck.LAYERS)
def test_every_layer_passes_its_gradcheck(layer, capsys):
    assert gradcheck.main([layer, "--seed", "3"]) == 0
    assert "FAIL" not in capsys.readouterr().out


@pytest.mark.parametrize("layer", ["layernorm", "attention", "loss"])
def test_a_wrong_gradient_is_reported(layer, capsys):
    assert gradcheck.main([layer, "--wrong"]) == 1
    assert "FAIL" in capsys.readouterr().out


# --- users' own modules: python -m minitf.gradcheck FILE.py:NAME ------------------------------
USER_LAYERS = '''
import minitf
from minitf import backend


class Scale(minitf.Module):
    """y = x * g; BUG picks a wrong backward."""
    BUG = None

    def __init__(self):
        self.g = minitf.Parameter(backend.asarray(backend.host.linspace(0.5, 1.5, 4)))

    def forward(self, x):
        self.save_for_backward(x)
        return x * self.g.data

    def backward(self, dy):
        (x,) = self.saved_tensors()
        dg = (dy * x).reshape(-1, 4).sum(axis=0)
        if self.BUG == "assign":
            self.g.grad = dg
        else:
            self.g.grad += dg
        if self.BUG == "no-return":
            return None
        return dy * self.g.data


class Product(minitf.Module):
    def forward(self, x, z):
        self.save_for_backward(x, z)
        return x * z

    def backward(self, dy):
        x, z = self.saved_tensors()
        return dy * z  # dz forgotten


class Assign(Scale):
    BUG = "assign"


class NoReturn(Scale):
    BUG = "no-return"


def product():
    return Product(), backend.asarray(backend.host.ones((2, 4))), backend.asarray(backend.host.ones((2, 4)))
'''


@pytest.mark.parametrize("name, code, message", [
    ("Scale", 0, None),
    ("Assign", 1, "FAIL parameter g: backward overwrote .grad (= instead of +=)"),
    ("NoReturn", 1, "FAIL input x: backward returned None"),
    ("product", 1, "FAIL input z: no gradient; backward returned 1 value(s) for 2 inputs (x, z)"),
])
def test_a_users_module_gets_the_same_checks(name, code, message, tmp_path, capsys):
    path = tmp_path / "my_layers.py"
    path.write_text(USER_LAYERS)
    assert gradcheck.main([f"{path}:{name}", "--shape", "2,3,4"]) == code
    out = capsys.readouterr().out
    assert (message in out) if message else "FAIL" not in out


def test_a_missing_file_or_name_is_one_line(tmp_path, capsys):
    for spec in [f"{tmp_path}/none.py:X", f"{tmp_path}:X"]:
        with pytest.raises(SystemExit) as error:
            gradcheck.main([spec])
        assert error.value.code == 2
    assert "no such file" in capsys.readouterr().err


def test_help_lists_only_layers_that_check_on_their_own(capsys):
    with pytest.raises(SystemExit):
        gradcheck.main(["--help"])
    layers = capsys.readouterr().out.split("one of:")[1].split(";")[0]
    assert "residual" not in layers and "tied" not in layers and "linear" in layers


def test_a_check_of_nothing_fails(tmp_path, capsys):
    """A layer with no parameter and only an integer input: no entry to compare, so no "1 of 1 match"."""
    path = tmp_path / "ids.py"
    path.write_text(USER_LAYERS + """

class Count(minitf.Module):
    def forward(self, ids):
        return ids * 1.0

    def backward(self, dy):
        return None


def count():
    return Count(), backend.asarray(backend.host.arange(6).reshape(2, 3))
""")
    assert gradcheck.main([f"{path}:count"]) == 1
    assert "FAIL nothing was checked" in capsys.readouterr().out


def test_the_study_tools_run_without_hypothesis(tmp_path):
    """hypothesis is a test extra: python -m minitf.gradcheck (a layer, a bug, FILE.py:NAME) and python -m
    minitf.exercise draw their random arrays with minitf.gradcheck.numeric's (minitf.testing's public names,
    without its hypothesis strategies), so a plain install runs them."""
    import subprocess
    import sys
    (tmp_path / "mine.py").write_text("import minitf\n\n\ndef make():\n    return minitf.LayerNorm(4)\n")
    runs = [("minitf.gradcheck", ["linear"]), ("minitf.gradcheck", ["--bug", "no-variance-term", "--fixed"]),
            ("minitf.gradcheck", [f"{tmp_path / 'mine.py'}:make"]), ("minitf.exercise", ["list"])]
    for module, argv in runs:
        blocked = ("import runpy, sys; sys.modules['hypothesis'] = None; "  # import hypothesis raises ImportError
                   f"sys.argv = ['{module}'] + {argv!r}; runpy.run_module('{module}', run_name='__main__')")
        done = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "hypothesis" not in done.stderr, (module, argv, done.stderr[-2000:])
        assert "FAIL" not in done.stdout
