"""Accessibility and phone width of both pages, in headless Chromium against a real ``octavo serve``:
every form control has a label and every button a name, the WCAG contrast ratio of the main
text/background pairs is at least 4.5:1 (computed from the rendered colours), and at 390x844 nothing
overflows horizontally, even with a long code line in the conversation. (Keyboard use is covered in
test_chat_page: Tab reaches the message box, Enter sends.)
"""

from __future__ import annotations

import json

import pytest

from tests.browser.helpers import KEY, open_page

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CHAT_READY = "#model option[value='SmolLM2-135M-Instruct']"
# text/background pairs that must be readable, by page; each selector must match something
CONTRAST = {
    "/": ["body", "header.top h1", "header.top nav a", "header.top label", ".field label", "summary", "#system",
          "#temperature", "#prompt", "select", "button.primary", "#new-chat", ".msg.user .body",
          ".msg.assistant .body", ".msg .role", ".msg .meta", ".msg pre code", "button.small"],
    "/dashboard": ["header.top h1", "header.top nav a", ".tile h2", ".tile .value", ".tile .sub", ".legend",
                   "table.summary th", "table.summary td", "#updated"],
}
CONVERSATION = [
    {"role": "user", "content": "Show me a long line of code."},
    {"role": "assistant", "content": "Here:\n\n```python\nprint('" + "x" * 300 + "')\n```\n\nand a long word: " + "y" * 120,
     "meta": "12 tokens · 0.4 s · finish: stop"},
]
CONTRAST_JS = """(selectors) => {
  const rgba = (s) => { const m = s.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const background = (el) => { for (let e = el; e; e = e.parentElement) { const c = rgba(getComputedStyle(e).backgroundColor);
    if (c && c[3] > 0) return c; } return [255, 255, 255, 1]; };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const out = [];
  for (const sel of selectors) for (const el of document.querySelectorAll(sel)) {
    if (el.disabled || !el.getClientRects().length) continue;  // disabled controls are exempt (WCAG 1.4.3)
    const fg = rgba(getComputedStyle(el).color), bg = background(el);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    out.push({sel, fg: getComputedStyle(el).color, bg: bg.join(","), ratio: (a + 0.05) / (b + 0.05)});
  }
  return out;
}"""
LABELS_JS = """() => {
  const name = (e) => ((e.labels && e.labels.length ? e.labels[0].textContent : '') || e.getAttribute('aria-label') ||
    (e.getAttribute('aria-labelledby') ? (document.getElementById(e.getAttribute('aria-labelledby')) || {}).textContent : '') || '').trim();
  return {controls: [...document.querySelectorAll('input, select, textarea')].map(e => [e.id, name(e)]),
          buttons: [...document.querySelectorAll('button, a')].map(e => [e.outerHTML.slice(0, 60),
                    (e.getAttribute('aria-label') || e.textContent || '').trim()])};
}"""
OVERFLOW_JS = """() => {
  const w = document.documentElement.clientWidth;
  const wide = [...document.querySelectorAll('body *')].filter(e => e.getClientRects().length &&
    e.getBoundingClientRect().right > w + 1 && !e.closest('pre') && !e.closest('.visually-hidden') && !e.closest('.skip'));
  return {width: w, scrollWidth: document.documentElement.scrollWidth, wide: wide.slice(0, 5).map(e => e.outerHTML.slice(0, 80))};
}"""


@pytest.fixture(scope="module")
def phone(browser, server):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                              has_touch=True, base_url=server.url)
    yield ctx
    ctx.close()


def _seed(context) -> None:
    context.add_init_script(f"localStorage.setItem('octavo.apiKey', {json.dumps(KEY)});"
                            f"localStorage.setItem('octavo.chat', {json.dumps(json.dumps(CONVERSATION))});")


@pytest.mark.parametrize("path", ["/", "/dashboard"])
def test_labels_and_contrast(browser, server, path):
    ctx = browser.new_context(viewport={"width": 1280, "height": 860}, base_url=server.url)
    _seed(ctx)
    page, errors = open_page(ctx, path, CHAT_READY if path == "/" else "#info-model")
    page.wait_for_timeout(300)
    if path == "/":
        page.evaluate("() => { window.octavo.askKey('check the dialog too'); }")  # its input needs a label too
        page.wait_for_selector("#key-dialog[open]")
    found = page.evaluate(LABELS_JS)
    assert all(name for _, name in found["controls"]), found["controls"]
    assert len(found["controls"]) >= (7 if path == "/" else 0), found["controls"]  # model ... prompt, key
    assert all(name for _, name in found["buttons"]), [b for b in found["buttons"] if not b[1]]
    if path == "/":
        page.keyboard.press("Escape")
    pairs = page.evaluate(CONTRAST_JS, CONTRAST[path])
    missing = set(CONTRAST[path]) - {p["sel"] for p in pairs}
    assert not missing, f"selectors that matched nothing visible: {missing}"
    low = [p for p in pairs if p["ratio"] < 4.5]
    assert not low, f"contrast below 4.5:1: {low}"
    assert not errors, errors
    ctx.close()


@pytest.mark.parametrize("path,name", [("/", "chat-phone.png"), ("/dashboard", "dashboard-phone.png")])
def test_phone_width_has_no_horizontal_overflow(phone, path, name, artifacts):
    _seed(phone)
    page, errors = open_page(phone, path, CHAT_READY if path == "/" else "#info-model")
    page.wait_for_timeout(1200)  # a dashboard poll or two
    layout = page.evaluate(OVERFLOW_JS)
    assert layout["scrollWidth"] <= layout["width"] and not layout["wide"], layout
    page.screenshot(path=str(artifacts / name), full_page=True)
    assert not errors, errors
    page.close()
