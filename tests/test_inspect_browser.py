"""The inspection page as a person uses it, in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by selenium (the ``browser`` extra). Each page opens from disk with no console
error and no network request; the layer and head selectors change the heat map; hovering a target token shows
its alternatives; the served page recomputes a typed sentence; a right-to-left override in a linked sentence
leaves the page's warning drawn left to right; a mixture of experts' grid shows each token's experts and, on
hover, its router's probabilities, and its load chart each layer's shares (a run without a log says so); a
screenshot of each view is saved under the test's temporary folder (``pytest --basetemp DIR`` keeps them where
you can look). The numbers themselves are checked against the model's without a browser
(tests/test_inspect.py)."""
import json
import shutil
import urllib.parse

import pytest

from minitf.inspect import main as inspect_main
from minitf.study.inspection import page
from tests.helpers import np
from tests.runs import QUIET, ROOT, TINY, make_corpus, train
from tests.test_inspect_server import serving
from tests.test_bert_train import TINY_BERT
from tests.test_llama_moe_train import SPARSE
from tests.test_lm_train import TINY_GPT, make_text

pytestmark = pytest.mark.extra("selenium", "browser")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs headless Chromium and its driver: apt-get install -y chromium chromium-driver (CI's second step)")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))  # no download: Debian's driver
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Pages of a post-LN and a pre-LN translation run (2 + 2 layers, a reference with a word the model
    never saw), of a GPT run, of a Llama-block run, of a mixture of experts' run and one of its checkpoints alone,
    and of a BERT masked-LM run (a text with [MASK])."""
    folder = tmp_path_factory.mktemp("pages")
    corpus = make_corpus(folder)
    made = {}
    for name, extra in (("post", []), ("pre", ["--pre-norm"])):
        run = folder / name
        assert train(corpus + TINY + QUIET + ["--num-layers", "2", "--max-steps", "8", "--eval-every", "4",
                                              "--out", run] + extra) == 0
        made[name] = (run, folder / f"{name}.html")
        assert inspect_main(["--checkpoint", str(run), "--text", "Der hund sieht ein rotes haus.", "--reference",
                             "The dog sees a red house.", "--out", str(made[name][1])]) == 0
    run = folder / "gpt"
    assert train(make_text(folder) + TINY_GPT + ["--max-steps", "6", "--eval-every", "3", "--out", run]) == 0
    made["gpt"] = (run, folder / "gpt.html")
    assert inspect_main(["--checkpoint", str(run), "--text", "the cat sees a dog.", "--out", str(made["gpt"][1])]) == 0
    run = folder / "llama"
    assert train(make_text(folder) + TINY_GPT + ["--model", "llama", "--num-kv-heads", "1", "--max-steps", "6",
                                                  "--eval-every", "3", "--out", run]) == 0
    made["llama"] = (run, folder / "llama.html")
    assert inspect_main(["--checkpoint", str(run), "--text", "the cat sees a dog.", "--out",
                         str(made["llama"][1])]) == 0
    run = folder / "moe"  # a mixture of experts: 2 sparse layers of 4 experts, 2 per token
    assert train(make_text(folder) + SPARSE + ["--max-steps", "6", "--eval-every", "3", "--out", run]) == 0
    made["moe"] = (run, folder / "moe.html")
    assert inspect_main(["--checkpoint", str(run), "--text", "the cat sees a dog.", "--out", str(made["moe"][1])]) == 0
    alone = shutil.copytree(run / "checkpoints" / "step-00000006", folder / "moe-checkpoint")  # no run log
    made["moe-alone"] = (alone, folder / "moe-alone.html")
    assert inspect_main(["--checkpoint", str(alone), "--text", "the cat.", "--out", str(made["moe-alone"][1])]) == 0
    run = folder / "bert"
    assert train(make_text(folder) + TINY_BERT + ["--max-steps", "6", "--eval-every", "3", "--out", run]) == 0
    made["bert"] = (run, folder / "bert.html")
    assert inspect_main(["--checkpoint", str(run), "--text", "the [MASK] sees a dog.", "--out",
                         str(made["bert"][1])]) == 0
    return made


def open_page(driver, path):
    driver.get(path.as_uri())
    driver.find_element("css selector", "body[data-ready='1']")  # the script ran to its end
    return page.read_data(path.read_text(encoding="utf-8"))


def console_errors(driver):
    return [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def wait_for(driver, css, seconds=30):
    """The first element matching ``css``, once it is there: a form's submit returns before the browser has
    loaded the answer, so a lookup right after it can still see the page before."""
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, seconds).until(lambda d: (d.find_elements("css selector", css) or [None])[0])


def fetched(driver):
    """Every resource the page asked for (images, scripts, styles, fetches) after its own document."""
    return driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")


def screenshot(driver, element_id, path):
    element = driver.find_element("id", element_id)
    height = driver.execute_script("return Math.ceil(document.documentElement.scrollHeight)")
    driver.set_window_size(1280, max(900, min(height, 8000)))  # the whole view, not what a small window shows
    driver.execute_script("arguments[0].scrollIntoView()", element)
    element.screenshot(str(path))
    driver.set_window_size(1280, 900)
    assert path.stat().st_size > 5000, path


def shown(piece):
    """A token as the page writes it (page.js's show, after page.visible)."""
    if piece == "":
        return "∅"
    return "␣" + piece[1:] if piece.startswith(" ") else piece


def heatmap(driver):
    svg = driver.find_element("id", "heatmap")
    return {key: svg.get_attribute(f"data-{key}") for key in ("kind", "layer", "head", "values")}


@needs_chromium
@pytest.mark.parametrize("name", ["post", "pre", "gpt", "llama", "moe", "bert"])
def test_the_page_opens_from_disk_with_no_error_and_no_request(name, browser, pages, tmp_path):
    data = open_page(browser, pages[name][1])
    assert console_errors(browser) == [] and fetched(browser) == []
    assert browser.find_element("css selector", "#page h1").text == data["title"]
    sparse = ["experts", "expert-load"] if name == "moe" else []  # a dense model has no expert section
    sections = ["tokens", "attention", "backward", "training"] + sparse
    links = [a.get_attribute("href").split("#")[1] for a in browser.find_elements("css selector", "nav a")]
    assert links == ["tokens", "attention", *sparse[:1], "backward", "training", *sparse[1:]]
    assert [section for section in ("experts", "expert-load") if browser.find_elements("id", section)] == sparse
    for section in sections:
        screenshot(browser, section, tmp_path / f"{name}-{section}.png")
    # the charts are drawn: one bar per step of the walk, one per source token, every curve
    example = data["examples"][0]
    steps = [s for s in example["walk"] if "label" in s]
    assert len(browser.find_elements("css selector", "#walk-chart rect")) == len(steps)
    assert len(browser.find_elements("css selector", "#embedding-chart rect")) == len(example["embedding_grad"]["norms"])
    charts = browser.find_elements("css selector", "#training figure")
    assert [c.get_attribute("data-chart") for c in charts] == ["loss", "score", "lr"]
    assert console_errors(browser) == []


@needs_chromium
@pytest.mark.parametrize("name, says", [("post", "This model is post-LN: in each block dx = LN′(dy)"),
                                        ("pre", "This model is pre-LN: in each block dx = dy + N′(dh) (N its LayerNorm)"),
                                        ("llama", "This model is pre-norm RMSNorm: in each block dx = dy + N′(dh) "
                                                  "(N its RMSNorm)")])
def test_the_backward_caption_names_the_models_own_norm_and_layout(name, says, browser, pages):
    """The backward section says how the model's blocks pass the gradient: a Llama is pre-norm with RMSNorm (its
    page once called it post-LN, the caption's fallback)."""
    open_page(browser, pages[name][1])
    caption = browser.find_element("css selector", "#backward p.caption").text
    assert says in caption and ("post-LN" in caption) == (name == "post")


@needs_chromium
@pytest.mark.parametrize("name, command, norm", [("post", "python -m minitf.trace --walk", "LayerNorm"),
                                                 ("gpt", "python -m minitf.trace --model gpt --walk", "LayerNorm"),
                                                 ("llama", "python -m minitf.trace --model llama --walk", "RMSNorm")])
def test_the_walk_names_its_own_trace_command_and_norm(name, command, norm, browser, pages):
    """The walk's caption names the command that prints the same steps for this model's kind, and its legend the
    model's own norm (a Llama page once named --model gpt and LayerNorm)."""
    open_page(browser, pages[name][1])
    figure = browser.find_element("css selector", "#backward figure[data-chart='walk']")
    caption = figure.find_element("css selector", "p.caption").text
    legend = figure.find_element("css selector", ".legend").text
    assert f"The steps that {command} prints" in caption and f"inside a block ({norm}′" in legend
    assert ("SublayerConnection" in caption) == (norm == "LayerNorm")


@needs_chromium
def test_the_selectors_change_the_heat_map(browser, pages, tmp_path):
    from selenium.webdriver.support.ui import Select
    data = open_page(browser, pages["post"][1])
    first = heatmap(browser)
    assert first["kind"] == "encoder self-attention" and (first["layer"], first["head"]) == ("0", "0")
    weights = page.decode_array(data["examples"][0]["attention"][0])
    assert first["values"] == " ".join(f"{v:.4f}" for v in weights[0, 0].ravel())  # the data, drawn
    Select(browser.find_element("id", "attn-layer")).select_by_value("1")
    second = heatmap(browser)
    assert second["layer"] == "1" and second["values"] != first["values"]
    assert second["values"] == " ".join(f"{v:.4f}" for v in weights[1, 0].ravel())
    Select(browser.find_element("id", "attn-head")).select_by_value("1")
    third = heatmap(browser)
    assert (third["layer"], third["head"]) == ("1", "1") and third["values"] != second["values"]
    Select(browser.find_element("id", "attn-kind")).select_by_visible_text("cross-attention")
    cross = heatmap(browser)
    assert cross["kind"] == "cross-attention" and (cross["layer"], cross["head"]) == ("1", "1")
    screenshot(browser, "attention", tmp_path / "cross-attention.png")
    Select(browser.find_element("id", "attn-head")).select_by_value("all")
    heads = browser.find_elements("css selector", ".heads figure")
    assert len(heads) == 2 and not browser.find_elements("id", "heatmap")
    screenshot(browser, "attention", tmp_path / "all-heads.png")
    heads[1].click()  # a head of the overview opens large
    assert heatmap(browser)["head"] == "1"
    assert console_errors(browser) == []


@needs_chromium
@pytest.mark.parametrize("name", ["post", "gpt"])
def test_hovering_a_target_token_shows_its_alternatives(name, browser, pages, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    data = open_page(browser, pages[name][1])
    example = data["examples"][0]
    chips = browser.find_elements("css selector", "#targets .token.target")
    position = 2
    chip = next(c for c in chips if c.get_attribute("data-position") == str(position))
    ActionChains(browser).move_to_element(chip).perform()
    panel = browser.find_element("id", "alternatives")
    assert f"Position {position}:" in panel.text
    rows = [[cell.text for cell in row.find_elements("css selector", "td")]
            for row in panel.find_elements("css selector", "tr")]
    assert [piece for piece, _, _ in rows] == [shown(piece) for piece, _ in example["top"][position]], panel.text
    for (_, _, probability), (_, expected) in zip(rows, example["top"][position]):
        assert float(probability.split()[0]) == pytest.approx(expected, rel=5e-3)
    assert rows[0][2] != ""
    screenshot(browser, "tokens", tmp_path / f"{name}-alternatives.png")
    # another token shows its own position; a click pins it
    other = next(c for c in chips if c.get_attribute("data-position") == "0")
    ActionChains(browser).move_to_element(other).click().perform()
    assert "Position 0:" in browser.find_element("id", "alternatives").text
    assert console_errors(browser) == []


@needs_chromium
def test_the_served_page_recomputes_a_typed_sentence(browser, pages, tmp_path):
    with serving(pages["post"][0]) as base:
        browser.get(base)
        browser.find_element("css selector", "body[data-ready='1']")
        box = browser.find_element("id", "text")
        box.send_keys("Die katze mag den vogel.")
        box.submit()
        wait_for(browser, "#targets .token.target")  # the new page's predictions
        data = json.loads(browser.execute_script(f"return document.getElementById('{page.DATA_ID}').textContent"))
        assert data["examples"][0]["text"] == "Die katze mag den vogel."
        screenshot(browser, "tokens", tmp_path / "served.png")
        assert console_errors(browser) == [] and fetched(browser) == []
        box = browser.find_element("id", "text")
        box.clear()
        box.send_keys("   ")
        box.submit()
        assert "is empty" in wait_for(browser, "#error").text  # the error, in the page
        # the browser logs the answer's status 400 (a bad request), and nothing else
        (entry,) = console_errors(browser)
        assert entry["source"] == "network" and "status of 400" in entry["message"], entry
        assert fetched(browser) == []
        screenshot(browser, "error", tmp_path / "served-error.png")


#: The left edge of each character of ``arguments[1]`` where it first occurs in element ``arguments[0]``'s text,
#: as the browser draws it.
LEFT_EDGES = """
const [element, word] = arguments, node = element.firstChild, at = node.data.indexOf(word), range = document.createRange();
const edges = [];
for (let i = at; i < at + word.length; i++) {
  range.setStart(node, i); range.setEnd(node, i + 1); edges.push(range.getBoundingClientRect().left);
}
return edges;
"""
#: The characters of the page's text, as drawn, that the browser does not show as themselves (its own line
#: breaks and tabs between blocks aside).
HIDDEN_SHOWN = """
return [...document.body.innerText].filter((c) => /[\\p{Cc}\\p{Cf}\\p{Zl}\\p{Zp}]/u.test(c) && c !== "\\n" && c !== "\\t")
  .map((c) => c.codePointAt(0));
"""


@needs_chromium
def test_a_right_to_left_override_in_the_text_never_turns_the_pages_warning_around(browser, pages, tmp_path):
    with serving(pages["post"][0]) as base:  # a link a page elsewhere could give
        browser.get(base + "?" + urllib.parse.urlencode({"text": "Der \u202ehund\u200b und."}))
        browser.find_element("css selector", "body[data-ready='1']")
        warning = browser.find_element("css selector", "#example .box.warning")
        screenshot(browser, "example", tmp_path / "override.png")
        edges = browser.execute_script(LEFT_EDGES, warning, "unknown token")  # after the override in the text
        assert edges == sorted(edges) and len(set(edges)) == len(edges), edges  # drawn left to right
        assert "[U+202E]" in warning.text and "[U+200B]" in warning.text, warning.text
        assert browser.execute_script(HIDDEN_SHOWN) == []


@needs_chromium
def test_the_picture_script_saves_each_view(pages, tmp_path, capsys):
    """scripts/inspect_screenshot.py (the README's picture): each view of a run's page as a PNG of the window's
    width, the page taller than the views of one chart."""
    import importlib.util
    import struct
    spec = importlib.util.spec_from_file_location("inspect_screenshot", ROOT / "scripts" / "inspect_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sizes = {}
    for view in module.VIEWS:
        out = tmp_path / f"{view}.png"
        assert module.main(["--run", str(pages["post"][0]), "--text", "Der hund sieht.", "--view", view,
                            "--width", "1000", "--out", str(out)]) == 0
        png = out.read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR", view
        sizes[view] = struct.unpack(">II", png[16:24])  # (width, height)
    assert sizes["page"][0] == 1000 and sizes["page"][1] > max(sizes["heads"][1], sizes["gradient"][1])
    assert "python -m minitf.inspect --checkpoint" in capsys.readouterr().out


@needs_chromium
def test_an_encoders_page_shows_each_masks_candidates_and_attention_both_ways(browser, pages, tmp_path):
    """The BERT page: only the mask is a scored chip (showing what the model puts there); hovering it lists its five
    candidates with the page's probabilities; the heat map has no masked cell (each position reads every other)."""
    from selenium.webdriver.common.action_chains import ActionChains
    data = open_page(browser, pages["bert"][1])
    example = data["examples"][0]
    chips = browser.find_elements("css selector", "#targets .token.target")
    assert [c.get_attribute("data-position") for c in chips] == ["2"] and "[MASK] →" in chips[0].text
    ActionChains(browser).move_to_element(chips[0]).perform()
    panel = browser.find_element("id", "alternatives")
    assert "most likely tokens for this mask" in panel.text
    rows = [[cell.text for cell in row.find_elements("css selector", "td")]
            for row in panel.find_elements("css selector", "tr")]
    assert [piece for piece, _, _ in rows] == [shown(piece) for piece, _ in example["top"][2]], panel.text
    screenshot(browser, "tokens", tmp_path / "bert-alternatives.png")
    first = heatmap(browser)
    assert first["kind"] == "self-attention (both directions)"
    weights = page.decode_array(example["attention"][0])
    assert first["values"] == " ".join(f"{v:.4f}" for v in weights[0, 0].ravel()) and weights[0, 0].min() > 0
    assert console_errors(browser) == []


@needs_chromium
def test_the_experts_grid_shows_each_tokens_choices_and_its_routers_probabilities(browser, pages, tmp_path):
    """A mixture of experts' page: one row per token, one cell per sparse layer listing the chosen experts as the
    data holds them; hovering a cell lists the router's probability of every expert there (the chosen ones marked
    with their weight), a click pins it; the last row counts each expert's tokens in this text."""
    from selenium.webdriver.common.action_chains import ActionChains
    data = open_page(browser, pages["moe"][1])
    experts = data["examples"][0]["experts"]
    T = len(data["examples"][0]["input"])
    cells = browser.find_elements("css selector", "#expert-grid td.route")
    assert len(cells) == 2 * T
    for cell in cells:
        i, t = experts["layers"].index(int(cell.get_attribute("data-layer"))), int(cell.get_attribute("data-position"))
        assert cell.get_attribute("data-experts") == " ".join(map(str, experts["idx"][i][t]))
    probs, weights = page.decode_array(experts["probs"]), page.decode_array(experts["weights"])
    cell = browser.find_element("css selector", "#expert-grid td.route[data-layer='1'][data-position='3']")
    ActionChains(browser).move_to_element(cell).perform()
    panel = browser.find_element("id", "router-panel")
    assert "Position 3" in panel.text and "layer 1" in panel.text
    rows = browser.find_elements("css selector", "#router-table tr")
    assert [int(r.get_attribute("data-expert")) for r in rows] == np.argsort(-probs[1, 3], kind="stable").tolist()
    for row in rows:
        e = int(row.get_attribute("data-expert"))
        text = row.find_elements("css selector", "td")[2].text
        assert float(text.split()[0]) == pytest.approx(probs[1, 3, e], rel=5e-3)
        chosen = e in experts["idx"][1][3]
        assert ("chosen" in row.get_attribute("class")) == chosen
        if chosen:
            assert float(text.split("weight ")[1].rstrip(")")) == pytest.approx(
                weights[1, 3, experts["idx"][1][3].index(e)], rel=5e-3)
    ActionChains(browser).click(cell).perform()  # pinned: leaving it shows it again
    other = browser.find_element("css selector", "#expert-grid td.route[data-layer='0'][data-position='0']")
    ActionChains(browser).move_to_element(other).perform()
    assert "Position 0" in panel.text
    ActionChains(browser).move_to_element(browser.find_element("css selector", "#experts h2")).perform()
    assert "Position 3" in browser.find_element("id", "router-panel").text
    counts = [c.get_attribute("data-counts") for c in browser.find_elements("css selector", "#expert-grid td.load")]
    assert counts == [" ".join(str(sum(e in row for row in layer)) for e in range(4)) for layer in experts["idx"]]
    screenshot(browser, "experts", tmp_path / "experts.png")
    assert console_errors(browser) == []


@needs_chromium
def test_the_load_chart_draws_each_layers_shares_and_a_run_without_a_log_says_so(browser, pages, tmp_path):
    """The load over training: one line per expert and the balanced 1/E, each expert's share of the layer's
    choices at each step as the run's counts give it; the layer selector redraws it for the other layer; a
    checkpoint out of its run says in one line that it has no load, and draws no chart."""
    from selenium.webdriver.support.ui import Select
    data = open_page(browser, pages["moe"][1])
    load = data["expert_load"]

    def drawn():
        figure = browser.find_element("css selector", "#expert-load figure[data-chart='expert-load']")
        shares = [[float(v) for v in row.split()] for row in figure.get_attribute("data-shares").split(";")]
        return figure.get_attribute("data-layer"), shares, figure.find_elements("css selector", "polyline")

    for i, layer in enumerate(load["layers"]):
        Select(browser.find_element("id", "load-layer")).select_by_index(i)
        shown_layer, shares, lines = drawn()
        counts = np.asarray(load["counts"][i])
        assert shown_layer == str(layer) and len(lines) == 4 + 1
        np.testing.assert_allclose(shares, counts / counts.sum(axis=1, keepdims=True), atol=6e-5)
    screenshot(browser, "expert-load", tmp_path / "expert-load.png")
    assert console_errors(browser) == []
    alone = open_page(browser, pages["moe-alone"][1])
    note = browser.find_element("id", "no-expert-load").text
    assert note == alone["expert_load_note"] and "without its run folder's metrics.jsonl" in note
    assert not browser.find_elements("css selector", "#expert-load figure")
    assert browser.find_elements("css selector", "#expert-grid td.route")  # its experts are still shown
