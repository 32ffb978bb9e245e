"""``specvis demo``: the page's helpers, then the real page in a headless Chromium (selenium + chromedriver).

The browser test starts ``python -m specvis.demo`` on a free loopback port, shows a one-line error for a
bad method option, runs emoji / sjd window=4 / seed 0 against AR, checks both images, the speedup and the
tokens per forward, and saves the screenshot to docs/img/demo.png. It skips only where gradio, selenium,
Chromium or chromedriver is missing (``pip install -e ".[test]"``; Debian: ``apt-get install chromium
chromium-driver``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specvis import demo

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "docs" / "img" / "demo.png"


def test_parser_and_helpers():
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers(dest="command"))
    a = parser.parse_args(["demo", "--port", "8123"])
    assert (a.command, a.port, a.host, a.model) == ("demo", 8123, "127.0.0.1", None)  # None: emoji preselected
    a = parser.parse_args(["demo", "--model", "random-tiny", "--model", "/some/ckpt"])
    assert a.model == ["random-tiny", "/some/ckpt"]
    assert demo.method_spec("sjd", "window=16:coupling=maximal") == "sjd:window=16:coupling=maximal"
    assert demo.method_spec("sjd", "sjd:window=4") == "sjd:window=4"
    assert demo.method_spec("speculative", " ") == "speculative"
    assert demo.parse_number("", "seed", int) is None
    assert demo.parse_number("7", "seed", int) == 7
    with pytest.raises(ValueError, match="seed must be a whole number"):
        demo.parse_number("1.5", "seed", int)
    with pytest.raises(ValueError, match="--port"):
        demo.main(["--port", "70000"])


def test_conditions_and_errors():
    models = demo.Models()
    pipe = models.get("random-tiny")
    assert demo.class_choices(pipe) == ["0: class0", "1: class1", "2: class2", "3: class3"]
    assert demo.parse_condition(pipe, "2: class2") == {"classes": [2]}
    assert demo.parse_condition(pipe, "class3") == {"classes": [3]}
    for bad, msg in [("9", "out of range"), ("zebra", "no class 'zebra'"), ("", "give a class")]:
        with pytest.raises(ValueError, match=msg):
            demo.parse_condition(pipe, bad)
    with pytest.raises(ValueError, match="no option 'windw'"):
        demo.compare(models, "random-tiny", "0", "sjd", "windw=4", "exact", 0)
    with pytest.raises(ValueError, match="offers only the models its operator chose"):
        demo.compare(models, "no-such-model", "0", "sjd", "window=4", "exact", 0)
    seen: dict[str, list[float]] = {}
    r = demo.compare(models, "random-tiny", "1", "sjd", "window=4", "exact", 0,
                     on_tokens=lambda run, f: seen.setdefault(run, []).append(f))
    assert set(seen) == {"ar", "sjd"}  # per-round token progress of both runs, ending complete
    assert all(v == sorted(v) and v[-1] == 1.0 and len(v) > 2 for v in seen.values())
    assert r.ar_stats.mean_accepted_length == 1.0 and r.method_stats.mean_accepted_length >= 1.0
    assert r.ar_image.size == r.method_image.size == r.heatmap.size
    html = demo.figures_html(r)
    assert 'id="sv-speedup"' in html and 'id="sv-tpf"' in html
    assert "\n" not in demo.error_line(ValueError("two\nlines"))


def test_text_model(tmp_path):
    """A text-to-image checkpoint directory (tiny random Janus-Pro): a prompt, no classes."""
    pytest.importorskip("transformers")
    from hf_tiny import make_janus

    path = str(make_janus(tmp_path / "janus"))
    models = demo.Models(extra=[path])  # the operator's --model
    pipe = models.get(path)
    assert demo.class_choices(pipe) == []
    assert demo.parse_condition(pipe, " a red apple ") == {"prompts": ["a red apple"]}
    with pytest.raises(ValueError, match="text-to-image: type a text prompt"):
        demo.parse_condition(pipe, " ")
    r = demo.compare(models, path, "a red apple", "sjd", "window=4", "exact", 0)
    assert r.ar_image.size == r.method_image.size
    assert r.ar_stats.mean_accepted_length == 1.0 and r.method_stats.mean_accepted_length >= 1.0


def _browser():
    """(chromium, chromedriver) paths, or a skip naming what is missing."""
    missing = [m for m in ("gradio", "selenium") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (pip install -e '.[test]')")
    chromium = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("Chromium and chromedriver not installed (Debian: apt-get install chromium chromium-driver)")
    return chromium, driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"demo server exited with {proc.returncode}: {proc.stdout.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"demo server did not answer on {url} within {timeout:.0f} s")


def test_demo_page_in_chromium():
    chromium, driver_path = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    # the waits are generous for loaded shared runners; on an idle machine the whole test takes well under 90 s
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "specvis.demo", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    browser = None
    try:
        t0 = time.monotonic()
        _wait_up(url, proc, 180)
        print(f"server up in {time.monotonic() - t0:.1f} s")
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1100"):
            opts.add_argument(arg)
        browser = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
        browser.get(url)
        wait = WebDriverWait(browser, 90)
        options = wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, "#sv-options textarea, #sv-options input")))

        def set_options(text: str) -> None:
            options.send_keys(Keys.CONTROL, "a")
            options.send_keys(Keys.DELETE)
            options.send_keys(text)
            browser.execute_script("arguments[0].blur()", options)

        # bad input: one line on the page, the server keeps running
        set_options("windw=4")
        browser.find_element(By.CSS_SELECTOR, "#sv-generate").click()
        error = wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, "#sv-status.sv-error")))
        assert "no option 'windw'" in error.text and "\n" not in error.text.strip()
        assert proc.poll() is None

        # emoji, sjd window 4, seed 0 against AR
        set_options("window=4")
        browser.find_element(By.CSS_SELECTOR, "#sv-generate").click()
        WebDriverWait(browser, 400).until(EC.visibility_of_element_located((By.CSS_SELECTOR, "#sv-speedup")))
        print(f"results after {time.monotonic() - t0:.1f} s")
        status = browser.find_element(By.CSS_SELECTOR, "#sv-status")
        assert "sv-error" not in status.get_attribute("class"), status.text
        loaded = "return Array.from(document.querySelectorAll(arguments[0])).filter(i => i.complete && i.naturalWidth > 0).length"
        for box in ("#sv-ar-image", "#sv-method-image", "#sv-heatmap"):
            WebDriverWait(browser, 15).until(lambda b, box=box: b.execute_script(loaded, f"{box} img") > 0)
        figures = {k: float(browser.find_element(By.CSS_SELECTOR, f"#sv-{k}").text)
                   for k in ("speedup", "tpf", "ar-wall", "method-wall", "ar-tpf")}
        assert figures["speedup"] > 0 and figures["ar-wall"] > 0 and figures["method-wall"] > 0
        assert figures["ar-tpf"] == 1.0 and 1.0 <= figures["tpf"] <= 5.0  # at most the window and one more
        assert "sjd:window=4" in browser.find_element(By.CSS_SELECTOR, "#sv-figures").text
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.HOME)
        assert browser.save_screenshot(str(SCREENSHOT))
    finally:
        if browser is not None:
            browser.quit()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
