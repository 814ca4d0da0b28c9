#!/usr/bin/env python3
"""Pictures of the inspection page, from a run:
``python scripts/inspect_screenshot.py --run runs/tiny [--text "..."] [--view page] [--out docs/figures/inspect.png]``.

Writes the page with ``python -m minitf.inspect`` (into a temporary folder), opens it in headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, driven by selenium: ``pip install -e ".[browser]"``) and saves
one view as a PNG: ``page`` (the README's picture: the top of the page down to the end of the attention, with
the last layer's cross-attention, a GPT's last layer's attention, and one target token's alternatives pinned),
``heads`` (every head of that attention side by side) or ``gradient`` (the chart of the gradient down the
residual stream). Prints the command that made the page.
"""
import argparse
import pathlib
import shlex
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minitf.atomic import write_atomic  # noqa: E402
from minitf.inspect import main as inspect_main  # noqa: E402
from minitf.study.inspection.page import read_data  # noqa: E402

DEFAULT_TEXT = "Ich habe keine Zeit."
VIEWS = ("page", "heads", "gradient")


def browser(width):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise SystemExit("needs Chromium and its driver: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},900", "--force-device-scale-factor=1", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(driver))


def show_last_attention(driver, data, head):
    """Choose the last attention of the page (cross-attention; a GPT's only one), its last layer, and ``head``."""
    from selenium.webdriver.support.ui import Select
    kinds = [a["name"] for a in data["examples"][0]["attention"]]
    Select(driver.find_element("id", "attn-kind")).select_by_visible_text(kinds[-1])
    layers = Select(driver.find_element("id", "attn-layer"))
    layers.select_by_index(len(layers.options) - 1)
    Select(driver.find_element("id", "attn-head")).select_by_value(head)


def fit(driver, width, height):
    """A window whose page area (not counting the browser's own bars) is ``height`` pixels tall."""
    driver.set_window_size(width, height)
    bars = driver.execute_script("return window.outerHeight - window.innerHeight")
    driver.set_window_size(width, height + bars)


def bottom_of(driver, element):
    return driver.execute_script("const r = arguments[0].getBoundingClientRect(); "
                                 "return Math.ceil(r.bottom + window.scrollY)", element)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, type=pathlib.Path, help="a run folder of train.py (or a checkpoint)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the sentence shown")
    p.add_argument("--reference", help="the target to score (default: the model's own translation)")
    p.add_argument("--view", choices=VIEWS, default="page")
    p.add_argument("--token", type=int, default=1, help="page: the target token whose alternatives are shown")
    p.add_argument("--width", type=int, default=1180, help="the browser window's width in pixels")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "figures" / "inspect.png")
    args = p.parse_args(argv)
    from selenium.webdriver.common.action_chains import ActionChains
    with tempfile.TemporaryDirectory() as folder:
        page = pathlib.Path(folder) / "inspect.html"
        command = ["--checkpoint", str(args.run), "--text", args.text]
        command += ["--reference", args.reference] if args.reference is not None else []
        print("python -m minitf.inspect " + shlex.join(command))
        if inspect_main(command + ["--out", str(page)]) != 0:
            return 1
        data = read_data(page.read_text(encoding="utf-8"))
        driver = browser(args.width)
        try:
            driver.get(page.as_uri())
            driver.find_element("css selector", "body[data-ready='1']")
            height = driver.execute_script("return document.documentElement.scrollHeight")
            fit(driver, args.width, height + 40)  # the whole page in the window: no scrolling
            if args.view == "gradient":
                png = driver.find_element("css selector", "figure[data-chart='points']").screenshot_as_png
            else:
                show_last_attention(driver, data, "all" if args.view == "heads" else "0")
                if args.view == "heads":
                    png = driver.find_element("id", "heatmap-area").screenshot_as_png
                else:
                    fit(driver, args.width, bottom_of(driver, driver.find_element("id", "attention")) + 24)
                    driver.execute_script("window.scrollTo(0, 0)")
                    chips = driver.find_elements("css selector", "#targets .token.target")
                    chip = chips[min(args.token, len(chips) - 1)]
                    ActionChains(driver).move_to_element(chip).click().perform()  # pinned: the panel stays
                    png = driver.get_screenshot_as_png()
            write_atomic(args.out, png)
        finally:
            driver.quit()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
