"""The search page in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by selenium): load the page from a running service, type a query, see ranked results
with title, snippet, score and semantic ID; markup in a document's title renders as text.
A screenshot is saved under the test's tmp dir. Skips (with the reason) without Chromium."""

from __future__ import annotations

import os
import shutil

import httpx
import pytest

from tests.serve.conftest import HOSTILE_SNIPPET, HOSTILE_TITLE


def _find(*names: str) -> str | None:
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


CHROMIUM = os.environ.get("SCALINGNOTE_CHROMIUM") or _find("chromium", "chromium-browser", "google-chrome")
CHROMEDRIVER = os.environ.get("SCALINGNOTE_CHROMEDRIVER") or _find("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs a headless Chromium and its driver (Debian/Ubuntu: `apt-get install chromium chromium-driver`); "
    f"found chromium={CHROMIUM}, chromedriver={CHROMEDRIVER}",
)


@pytest.fixture()
def browser(tmp_path):
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install -r requirements.txt)"
    )
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1200,1600",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        opts.add_argument(a)
    drv = webdriver.Chrome(
        service=Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")), options=opts
    )
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


def _search(drv, query: str, mode: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import Select, WebDriverWait

    box = drv.find_element(By.ID, "query")
    box.clear()
    box.send_keys(query)
    Select(drv.find_element(By.ID, "mode")).select_by_value(mode)
    drv.find_element(By.ID, "go").click()
    WebDriverWait(drv, 60).until(EC.text_to_be_present_in_element((By.ID, "status"), "results ("))
    return drv.find_elements(By.CSS_SELECTOR, "#results li.hit")


def test_page_search_in_chromium_renders_markup_as_text(browser, page_server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page_server.url + "/")
    assert browser.title == "scalingnote search"
    # the page learns the available modes from /healthz
    WebDriverWait(browser, 30).until(
        EC.text_to_be_present_in_element((By.ID, "service-info"), "modes dense, bm25, hybrid")
    )

    hits = _search(browser, "quick brown fox", "bm25")
    ref = httpx.post(
        page_server.url + "/search", json={"query": "quick brown fox", "k": 10, "mode": "bm25"}, trust_env=False
    ).json()["results"]
    assert [h.get_attribute("data-doc-id") for h in hits] == [r["doc_id"] for r in ref]  # ranked as the API ranks them
    titles = [h.find_element(By.CLASS_NAME, "title").text for h in hits]
    assert HOSTILE_TITLE in titles  # the <script> title is shown as literal text ...
    assert browser.execute_script("return window.__pwned === undefined")  # ... and never ran
    assert not browser.find_elements(By.CSS_SELECTOR, "#results script, #results img, #results b")
    snippets = [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#results .snippet")]
    assert HOSTILE_SNIPPET in snippets
    first_meta = hits[0].find_element(By.CLASS_NAME, "meta").text
    assert f"doc {ref[0]['doc_id']}" in first_meta and f"score {ref[0]['score']:.4f}" in first_meta
    assert "semantic ID " + "-".join(str(x) for x in ref[0]["semantic_id"]) in first_meta
    status = browser.find_element(By.ID, "status").text
    assert "service" in status and " ms" in status  # per-request latency shown
    assert browser.save_screenshot(str(tmp_path / "search_page_bm25.png"))

    hits = _search(browser, "vitamin deficiency", "hybrid")
    assert len(hits) == 10
    assert browser.execute_script("return window.__pwned === undefined")
    shot = tmp_path / "search_page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 1000
    print(f"screenshot: {shot}")

    # a refused request shows the service's error message (k above the service's max_k)
    browser.execute_script("document.getElementById('k').removeAttribute('max')")
    browser.find_element(By.ID, "k").clear()
    browser.find_element(By.ID, "k").send_keys("5000")
    browser.find_element(By.ID, "go").click()
    WebDriverWait(browser, 30).until(EC.text_to_be_present_in_element((By.ID, "status"), "Error 422"))
