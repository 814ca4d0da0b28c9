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
