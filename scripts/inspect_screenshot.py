#!/usr/bin/env python3
"""The README's picture of the inspection page, from a run:
``python scripts/inspect_screenshot.py --run runs/tiny [--text "..."] [--out docs/figures/inspect.png]``.

Writes the page with ``python -m minitf.inspect`` (into a temporary folder), opens it in headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, driven by selenium: ``pip install -e ".[browser]"``), shows the
last decoder layer's cross-attention (a GPT run: its last layer's attention) and the alternatives of one target
token, and saves the top of the page, down to the end of the attention, as a PNG. Prints the command it ran.
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
from minitf.inspection.page import read_data  # noqa: E402

DEFAULT_TEXT = "Ich habe keine Zeit."


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, type=pathlib.Path, help="a run folder of train.py (or a checkpoint)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the sentence shown")
    p.add_argument("--token", type=int, default=1, help="the target token whose alternatives are shown")
    p.add_argument("--width", type=int, default=1180, help="the browser window's width in pixels")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "figures" / "inspect.png")
    args = p.parse_args(argv)
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select
    with tempfile.TemporaryDirectory() as folder:
        page = pathlib.Path(folder) / "inspect.html"
        command = ["--checkpoint", str(args.run), "--text", args.text, "--out", str(page)]
        print("python -m minitf.inspect " + shlex.join(command[:-2]))
        if inspect_main(command) != 0:
            return 1
        data = read_data(page.read_text(encoding="utf-8"))
        driver = browser(args.width)
        try:
            driver.get(page.as_uri())
            driver.find_element("css selector", "body[data-ready='1']")
            kinds = [a["name"] for a in data["examples"][0]["attention"]]
            Select(driver.find_element("id", "attn-kind")).select_by_visible_text(kinds[-1])
            layers = Select(driver.find_element("id", "attn-layer"))
            layers.select_by_index(len(layers.options) - 1)
            attention = driver.find_element("id", "attention")
            bottom = driver.execute_script("const r = arguments[0].getBoundingClientRect(); "
                                           "return Math.ceil(r.bottom + window.scrollY)", attention)
            driver.set_window_size(args.width, bottom + 24)
            driver.execute_script("window.scrollTo(0, 0)")
            chips = driver.find_elements("css selector", "#targets .token.target")
            chip = chips[min(args.token, len(chips) - 1)]
            ActionChains(driver).move_to_element(chip).click().perform()  # pinned: the panel stays
            write_atomic(args.out, driver.get_screenshot_as_png())
        finally:
            driver.quit()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
