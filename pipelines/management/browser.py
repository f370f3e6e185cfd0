"""Headless Chromium for the browser test and the push benchmark: Debian's chromium and
chromium-driver (no browser download), with the flags this sandbox needs."""
from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--window-size=1400,1200")


def headless_chromium() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    # Keep the page's console: a test that fails can show the page's own errors.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def log_in(driver: Any, base_url: str, username: str, password: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base_url + "/login/")
    driver.find_element(By.ID, "id_username").send_keys(username)
    driver.find_element(By.ID, "id_password").send_keys(password)
    driver.find_element(By.ID, "login-submit").click()
    # click() does not wait for the POST: a get() right after could abort it.
    WebDriverWait(driver, 20).until(lambda d: "/login/" not in d.current_url)
