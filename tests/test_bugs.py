"""The realistic bugs of ``python -m minitf.gradcheck --bug NAME`` (minitf/study/bugs.py):
each is caught, the same hand-written backward with the right line passes, and the
pattern each hint describes is really there.

Pass criterion (minitf.gradcheck.gradients_match): max |a - n| <= 1e-6 max(|a|, |n|) + 1e-7,
float64 central differences with h = 1e-6 (errors ~1e-10 when right); every bug is off by
O(1) relative error, so the margin is about six orders of magnitude either way."""
import math

import pytest

from minitf import backend, gradcheck
from minitf.study import bugs
from minitf.gradcheck import compare_gradients, gradients_match

np = backend.host
BUG_NAMES = list(bugs.BUGS)


def report_of(name, seed, buggy=True):
    rng = backend.host_rng(seed)
    with backend.default_dtype("float64"):
        backend.manual_seed(seed)
        forward, backward, inputs, params = bugs.build(name, rng, buggy=buggy)
        report = compare_gradients(forward, backward, inputs, params, seed=seed)
    return {n: (backend.to_numpy(a), backend.to_numpy(nu)) for n, a, nu, _ in report}, inputs


def failing(report):
    return {n for n, (a, nu) in report.items() if not gradients_match(a, nu)}


def test_there_are_at_least_eight_bugs_in_distinct_places():
    assert len(bugs.BUGS) >= 8
    assert len({b.layer for b in bugs.BUGS.values()}) >= 6


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", BUG_NAMES)
def test_each_bug_is_caught_and_the_right_line_passes(name, seed):
    report, _ = report_of(name, seed, buggy=True)
    assert failing(report), f"{name}: the check did not catch the bug (seed {seed})"
    fixed, _ = report_of(name, seed, buggy=False)
    assert not failing(fixed), f"{name}: the right line fails: {failing(fixed)}"


@pytest.mark.parametrize("name", BUG_NAMES)
def test_cli_prints_the_furthest_entry_and_a_hint(name, capsys):
    assert gradcheck.main(["--bug", name]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "furthest off: " in out and "hint: " in out
    assert gradcheck.main(["--bug", name, "--fixed"]) == 0
    assert "FAIL" not in capsys.readouterr().out


@pytest.mark.parametrize("name", [n for n in BUG_NAMES if bugs.BUGS[n].layer in gradcheck.LAYERS])
def test_the_library_layer_itself_passes(name, capsys):
    assert gradcheck.main([bugs.BUGS[name].layer]) == 0


def test_a_bug_named_with_another_layer_is_refused(capsys):
    with pytest.raises(SystemExit) as error:
        gradcheck.main(["linear", "--bug", "no-scale"])
    assert error.value.code == 2 and "lives in layer 'attention'" in capsys.readouterr().err


def test_worst_entry_finds_the_index_and_counts():
    a, n = np.zeros((2, 3)), np.zeros((2, 3))
    a[1, 2], n[0, 0] = 5.0, 1e-9  # one entry off by 5, one within atol
    assert gradcheck.worst_entry(a, n) == ((1, 2), 5.0, 0.0, 1, 6)


# --- the patterns the hints name (docs/bugs.md explains them) -------------------------------
def test_missing_scale_is_a_constant_factor_sqrt_dk_on_dq_and_dk():
    report, _ = report_of("no-scale", 0)
    assert failing(report) == {"Q", "K"}
    for name in ("Q", "K"):
        a, n = report[name]
        assert np.allclose(a, math.sqrt(bugs.DK) * n, rtol=1e-6, atol=1e-8)


def test_dropped_skip_path_is_off_by_exactly_the_upstream_gradient():
    report, inputs = report_of("no-skip-gradient", 0)
    assert failing(report) == {"x"}
    a, n = report["x"]
    # compare_gradients draws G from host_rng([seed, 0x5EED]); the one output has x's shape
    G = backend.host_rng([0, 0x5EED]).standard_normal(a.shape)
    assert np.allclose(n - a, G, atol=1e-7)


def test_fancy_index_add_is_wrong_only_on_repeated_ids():
    report, _ = report_of("fancy-index-add", 0)
    a, n = report["weight"]
    rows_off = set(np.nonzero(np.abs(a - n).max(axis=1) > 1e-6)[0].tolist())
    ids = backend.host_rng(0).integers(0, bugs.V, (bugs.B, bugs.T))  # the build's first draw
    ids[1, 0] = ids[0, 0] = ids[0, 2]
    values, counts = np.unique(ids, return_counts=True)
    assert rows_off == set(values[counts > 1].tolist())


def test_loss_over_all_positions_is_off_by_tokens_over_positions():
    report, _ = report_of("mean-over-all-tokens", 0)
    a, n = report["logits"]
    assert np.allclose(a, n * 3 / 6, atol=1e-9)  # 3 real tokens among B*T = 6 positions


def test_softmax_error_is_proportional_to_y_within_each_row():
    report, inputs = report_of("no-subtracted-sum", 0)
    a, n = report["x"]
    x = backend.to_numpy(inputs["x"])
    y = np.exp(x - x.max(-1, keepdims=True))
    y /= y.sum(-1, keepdims=True)
    ratio = (a - n) / y  # one number per row: sum(dy * y)
    assert np.allclose(ratio, ratio[..., :1], atol=1e-6)


def test_tied_overwrite_zeroes_the_rows_of_unused_ids():
    report, _ = report_of("tied-overwrite", 0)
    a, n = report["weight"]
    assert not a[-2:].any() and np.abs(n[-2:]).max() > 1e-3  # ids V-2, V-1 never occur


def test_position_mean_is_off_by_one_over_the_batch_on_the_rows_read():
    report, _ = report_of("position-mean", 0)
    assert failing(report) == {"weight"}
    a, n = report["weight"]
    assert np.allclose(a, n / bugs.B, atol=1e-9)
    assert not a[[0, -1]].any() and np.abs(n[[0, -1]]).max() <= 1e-7  # start 1, T rows: 0 and T+1 unread
    assert np.abs(n[1:-1]).min(axis=1).max() > 1e-3


def test_gelu_without_the_product_term_is_off_by_x_phi_dy():
    report, inputs = report_of("gelu-no-product-term", 0)
    a, n = report["x"]
    x = backend.to_numpy(inputs["x"])
    G = backend.host_rng([0, 0x5EED]).standard_normal(a.shape)  # compare_gradients' upstream gradient
    assert np.allclose(n - a, x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi) * G, atol=1e-7)


def test_reshape_heads_leaves_the_output_projection_right():
    report, _ = report_of("reshape-heads", 0)
    assert failing(report) == {"x", "w_qkv", "b_qkv"}


def test_the_outputs_quoted_in_docs_bugs_md_are_current(capsys):
    """Every ```text block of docs/bugs.md that starts with a gradcheck command holds that
    command's output. Compared: the lines that carry the finding (FAIL rows, 'furthest off',
    'hint'); the 'ok' rows' errors (~1e-10) are rounding noise that varies between BLAS builds."""
    import pathlib
    import re
    import shlex
    if backend.get_device() != "cpu":
        pytest.skip("the quoted output is from the CPU backend")
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "bugs.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```text[^\n]*\n\$ python -m minitf.gradcheck ([^\n]*)\n(.*?)^```", page, re.M | re.S)
    assert len(blocks) == len(bugs.BUGS)

    def findings(text):
        return [line.rstrip() for line in text.splitlines()
                if "FAIL" in line or line.lstrip().startswith(("furthest off", "hint:"))]

    for command, quoted in blocks:
        gradcheck.main(shlex.split(command))
        assert findings(capsys.readouterr().out) == findings(quoted), command
