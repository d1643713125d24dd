"""`evalkube report` as a person sees it: the HTML file opened in headless Chromium (Debian's
`chromium` and `chromium-driver`, installed by `.ci/browser.sh`) and driven with selenium.

Skips only outside CI when the browser is missing; under CI=true a missing browser fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.integration.reporting.report_data import (
    INJECTION,
    ROW_INJECTION,
    RUN,
    TRACEBACK,
    make_report_store,
)

pytestmark = pytest.mark.timeout(180)

EVALKUBE = Path(sys.executable).parent / "evalkube"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        require("Chromium and chromedriver are not installed (bash .ci/browser.sh)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        require("selenium is not installed (make setup)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in CI's container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1600",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    url = make_report_store(root / "results.db")
    out = root / "report.html"
    done = subprocess.run(
        [str(EVALKUBE), "report", RUN, "--out", str(out), "--db", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture
def page(browser: Any, report: Path) -> Any:
    browser.get(report.as_uri())
    return browser


def visible_samples(page: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [
        article.find_element(By.CSS_SELECTOR, ".sid").text
        for article in page.find_elements(By.CSS_SELECTOR, "article.sample")
        if article.is_displayed()
    ]


def test_scores_table_shows_the_runs_values(page: Any) -> None:
    from selenium.webdriver.common.by import By

    rows = page.find_elements(By.CSS_SELECTOR, "table#scores tbody tr")
    seen = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")][:6] for row in rows]
    assert seen == [
        ["capitals", "gpt-x", "5", "3", "1", "1"],
        ["math", "gpt-x", "2", "2", "0", "0"],
    ]
    metrics = [
        [
            (item.find_element(By.CLASS_NAME, "metric-name").text,
             item.find_element(By.CLASS_NAME, "metric-value").text)
            for item in row.find_elements(By.CSS_SELECTOR, "ul.metrics li")
        ]
        for row in rows
    ]  # fmt: skip
    assert metrics == [[("exact", "0.4000"), ("f1", "0.5500")], [("exact", "0.5000")]]
    assert "Succeeded" in page.find_element(By.ID, "phase").text


def test_histograms_are_drawn(page: Any) -> None:
    from selenium.webdriver.common.by import By

    figure = page.find_element(
        By.CSS_SELECTOR, 'figure.hist[data-task="capitals"][data-metric="f1"]'
    )
    assert figure.is_displayed()
    bars = figure.find_elements(By.TAG_NAME, "rect")
    assert len(bars) == 10
    assert "n = 3" in figure.text  # the three capitals samples with an f1 score
    heights = [float(bar.get_attribute("height")) for bar in bars]
    assert sum(1 for h in heights if h > 0) == 3  # 0.25, 0.5 and 1.0 in different bins


def test_filters_hide_rows(page: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    every = ["cap-paris", "cap-rome", "cap-evil", "cap-empty", "cap-crash", "math-1", "math-2"]
    assert visible_samples(page) == every
    status = Select(page.find_element(By.NAME, "status"))
    status.select_by_value("errored")
    assert visible_samples(page) == ["cap-crash"]
    assert page.find_element(By.ID, "shown").text == "1"
    status.select_by_value("wrong")
    assert visible_samples(page) == ["cap-rome", "math-2"]
    status.select_by_value("failed")
    assert visible_samples(page) == ["cap-empty", "cap-crash"]
    status.select_by_value("")
    Select(page.find_element(By.NAME, "task")).select_by_visible_text("math")
    assert visible_samples(page) == ["math-1", "math-2"]
    Select(page.find_element(By.NAME, "task")).select_by_value("")
    page.find_element(By.NAME, "text").send_keys("MILAN")
    assert visible_samples(page) == ["cap-rome"]


def test_the_line_a_person_scans_names_the_dataset_row(page: Any) -> None:
    """Each sample's summary line leads with its dataset row id, the sample id beside it, and
    the text filter finds a sample by its row id."""
    from selenium.webdriver.common.by import By

    lines = [
        (
            article.find_element(By.CSS_SELECTOR, "summary .rid").text,
            article.find_element(By.CSS_SELECTOR, "summary .sid").text,
        )
        for article in page.find_elements(By.CSS_SELECTOR, "article.sample")
    ]
    assert lines == [
        ("fr", "cap-paris"),
        ("it", "cap-rome"),
        (ROW_INJECTION, "cap-evil"),
        ("pe", "cap-empty"),
        ("td", "cap-crash"),
        ("0", "math-1"),
        ("1", "math-2"),
    ]
    assert page.find_elements(By.ID, "rowinjected") == []  # a row id is text, not markup
    page.find_element(By.NAME, "text").send_keys("rowinjected")
    assert visible_samples(page) == ["cap-evil"]


def test_injected_markup_is_shown_as_text_and_never_runs(page: Any) -> None:
    from selenium.webdriver.common.by import By

    assert page.execute_script("return window.pwned") is None
    assert page.title != "pwned"
    assert page.find_elements(By.ID, "injected") == []
    evil = page.find_element(By.XPATH, "//article[.//span[@class='sid' and text()='cap-evil']]")
    evil.find_element(By.TAG_NAME, "summary").click()
    shown = evil.find_element(By.CSS_SELECTOR, "pre.output_text").text
    assert shown == INJECTION
    # the filter script still works after the untrusted sample (the page is intact)
    page.find_element(By.NAME, "text").send_keys("window.pwned")
    assert visible_samples(page) == ["cap-evil"]


def test_traceback_and_judge_are_readable(page: Any) -> None:
    from selenium.webdriver.common.by import By

    crash = page.find_element(By.XPATH, "//article[.//span[@class='sid' and text()='cap-crash']]")
    crash.find_element(By.TAG_NAME, "summary").click()
    trace = crash.find_element(By.CSS_SELECTOR, "pre.traceback")
    assert trace.is_displayed()
    assert trace.text == TRACEBACK  # lines, not a JSON string with \n in it
    assert crash.find_element(By.CSS_SELECTOR, "pre.error").text == "grading · KeyError: 'q9'"
    rome = page.find_element(By.XPATH, "//article[.//span[@class='sid' and text()='cap-rome']]")
    rome.find_element(By.TAG_NAME, "summary").click()
    judge = rome.find_element(By.CSS_SELECTOR, "pre.judge").text
    assert judge.splitlines() == [
        "{",
        '  "rubric": {',
        '    "accuracy": 2,',
        '    "style": 1',
        "  },",
        '  "verdict": "partially right"',
        "}",
    ]
