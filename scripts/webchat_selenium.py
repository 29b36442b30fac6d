#!/usr/bin/env python3
"""End-to-end test of the mllm-server web chat page in a real headless Chromium.

It opens the page, sets temperature to 0 in the settings panel (so the answer
is deterministic), asks "What is the capital of France?", waits for the
streamed reply to finish, checks that it mentions "Paris" and saves a
screenshot.

Requirements (Debian/Ubuntu):

    apt-get update && apt-get install -y chromium chromium-driver
    pip install selenium

Start the server first, in another terminal, e.g.:

    cargo run --release -p mllm-server -- <server arguments, model path ...>

then run:

    python3 scripts/webchat_selenium.py --url http://127.0.0.1:8080/ \
        --screenshot webchat.png [--timeout 120]

Exit status: 0 on success, 1 on failure (with a message on stderr).
"""

import argparse
import shutil
import sys
import tempfile
import time

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
QUESTION = "What is the capital of France?"
EXPECTED = "Paris"


class TestFailure(Exception):
    pass


def fail(msg):
    raise TestFailure(msg)


def main():
    try:
        return run()
    except TestFailure as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1


def run():
    ap = argparse.ArgumentParser(description="Selenium test of the mllm-server web chat page")
    ap.add_argument("--url", default="http://127.0.0.1:8080/", help="page URL (default: %(default)s)")
    ap.add_argument("--screenshot", default="webchat.png", help="where to save a PNG screenshot")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the reply")
    args = ap.parse_args()

    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
    except ImportError:
        fail("selenium is not installed (pip install selenium)")

    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            fail(f"{path} not found (apt-get install -y chromium chromium-driver)")

    profile = tempfile.mkdtemp(prefix="webchat-selenium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1200,900",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(flag)

    driver = None
    screenshot_saved = False

    def save_screenshot():
        try:
            driver.save_screenshot(args.screenshot)
            print(f"screenshot saved to {args.screenshot}")
        except WebDriverException as e:
            print(f"warning: could not save screenshot: {e.msg or e}", file=sys.stderr)

    try:
        try:
            driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
        except WebDriverException as e:
            fail(f"could not start Chromium/chromedriver: {e.msg or e}")

        try:
            driver.get(args.url)
        except WebDriverException as e:
            fail(f"could not open {args.url}: {e.msg or e} (is the server running?)")

        def by_id(i):
            els = driver.find_elements(By.ID, i)
            if not els:
                fail(f"element #{i} not found on {args.url} (is this the mllm web chat page?)")
            return els[0]

        body = driver.find_element(By.TAG_NAME, "body")
        prompt, send = by_id("prompt"), by_id("send")

        # Temperature 0 -> greedy, deterministic answer.
        temp = by_id("temperature")
        if not temp.is_displayed():
            by_id("settings-toggle").click()
        try:
            temp.clear()
            temp.send_keys("0")
        except WebDriverException:
            pass
        if temp.get_attribute("value") != "0":
            # fall back to setting it directly and notifying the page
            driver.execute_script(
                "arguments[0].value='0';"
                "arguments[0].dispatchEvent(new Event('input',{bubbles:true}));"
                "arguments[0].dispatchEvent(new Event('change',{bubbles:true}));",
                temp,
            )
        if temp.get_attribute("value") != "0":
            fail("could not set temperature to 0")

        n_before = len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
        n_err_before = len(driver.find_elements(By.CSS_SELECTOR, ".msg.error"))
        prompt.click()
        prompt.send_keys(QUESTION)
        send.click()
        t0 = time.monotonic()

        # Wait for generation to start (busy=1) or an answer/error to appear,
        # then for it to finish (busy=0) with a non-empty assistant bubble.
        reply = None
        while True:
            elapsed = time.monotonic() - t0
            if elapsed > args.timeout:
                busy = body.get_attribute("data-busy")
                fail(f"no complete reply within {args.timeout:.0f}s (data-busy={busy})")
            errors = driver.find_elements(By.CSS_SELECTOR, ".msg.error")
            if len(errors) > n_err_before:
                fail(f"the page shows an error: {errors[-1].text.strip()}")
            busy = body.get_attribute("data-busy")
            bubbles = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")
            if busy == "0" and len(bubbles) > n_before:
                text = bubbles[-1].text.strip()
                if text:
                    reply = text
                    break
            time.sleep(0.25)

        elapsed = time.monotonic() - t0
        print(f"reply after {elapsed:.1f}s:\n{reply}")
        save_screenshot()
        screenshot_saved = True

        if EXPECTED not in reply:
            fail(f"the reply does not contain {EXPECTED!r}")
        model = driver.find_elements(By.ID, "model")
        if model:
            print(f"model shown in header: {model[0].text.strip()}")
        print("OK")
        return 0
    finally:
        if driver is not None:
            if not screenshot_saved:
                save_screenshot()  # what the page looked like when it failed
            try:
                driver.quit()
            except Exception:
                pass
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
