"""A name, label or message shown by the dashboard cannot break out of an HTML attribute (docs/security.md,
"The dashboard's escaping").

The dashboard's scripts build rows as HTML strings and escape what they put in them with one helper of
``api/ui/static/app.js``, in text (``<code>${esc(reason)}</code>``) and in attribute values
(``value="${esc(name)}"``, ``data-job-id="${esc(id)}"``, ``href="${esc(href)}"``). The old helper wrote the text
into a ``div``'s ``textContent`` and read back ``innerHTML``, which escapes ``&``, ``<``, ``>`` and no-break
spaces only (the HTML standard's serialisation of a text node), so a ``"`` or ``'`` in a job's name closed the
attribute and added attributes of its own (``x" autofocus onfocus="...``).

app.js runs here in a real JavaScript engine (Node, under ``vm``: app.js is a browser script, not a module). The
old helper (then ``App.escapeText``; the test called it by that name to see it fail) needs a DOM: ``document`` is a stand-in whose ``innerHTML`` serialises text exactly as the standard
says (see ``DOCUMENT`` below; the new helper does not use it). The HTML each snippet builds is then parsed by
Python's ``html.parser`` (the browser's tokeniser rules): each element must come out with the attributes it was
written with, the payload whole in its value, and no new element or attribute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "api" / "ui" / "static"
NODE = shutil.which("node") or shutil.which("nodejs")

PAYLOADS = [
    'x" autofocus onfocus="alert(1)',
    "x' autofocus onfocus='alert(1)",
    "</code><img src=x onerror=alert(1)>",
    "a & b &amp; <b>bold</b>",
    "\"'<>&`=\u00a0",
]

# A stand-in for the browser's document: what app.js touches when it loads, and a div whose innerHTML
# serialises its text as the HTML standard's "escaping a string" (not in attribute mode) does: &, U+00A0, <, >.
DOCUMENT = r"""
const document = {
  querySelector: () => null,
  querySelectorAll: () => [],
  addEventListener: () => {},
  createElement: () => {
    let text = "";
    return {
      set textContent(value) { text = String(value); },
      get innerHTML() {
        return text.replace(/&/g, "&amp;").replace(/\u00a0/g, "&nbsp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
      },
    };
  },
};
"""

# The shapes the scripts build (job.js's deploy form, cluster.js's rows, deployment.js's links, every reason).
SNIPPETS = r"""
const esc = App.escapeHtml;
const out = payloads.map((p) => ({
  payload: p,
  input: `<input type="text" name="name" value="${esc(p)}-1" maxlength="63" required>`,
  row: `<tr data-node-id="${esc(p)}"><td class="mono">${esc(p)}</td></tr>`,
  link: `<a href="${esc(p)}">${esc(p)}</a>`,
  single: `<span title='${esc(p)}'>${esc(p)}</span>`,
  text: `<code>${esc(p)}</code> ${esc(p)}`,
}));
process.stdout.write(JSON.stringify(out));
"""


class Parsed(HTMLParser):
    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text = ""
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text += data


def run_app_js() -> list[dict[str, str]]:
    if NODE is None:
        if os.environ.get("CI"):
            pytest.fail("node is not installed: the dashboard's escaping test needs a JavaScript engine")
        pytest.skip("node is not installed (apt-get install nodejs): the dashboard's escaping test needs it")
    script = (
        "const vm = require('vm');\n"
        f"const source = {json.dumps((STATIC / 'app.js').read_text())};\n"
        f"const payloads = {json.dumps(PAYLOADS)};\n"
        "const context = vm.createContext({ process, payloads });\n"
        f"vm.runInContext({json.dumps(DOCUMENT)} + source + {json.dumps(SNIPPETS)}, context);\n"
    )
    done = subprocess.run([NODE, "-e", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_name_with_quotes_and_brackets_stays_inside_its_attribute_and_text():
    """On the old helper (``App.escapeText``: textContent, then innerHTML) the first payload came out of
    ``value="..."``: ``AssertionError: ('input', '<input type="text" name="name" value="x" autofocus
    onfocus="alert(1)-1" maxlength="63" required>')``."""
    for built in run_app_js():
        payload = built["payload"]
        expected = {
            "input": [
                (
                    "input",
                    {"type": "text", "name": "name", "value": f"{payload}-1", "maxlength": "63", "required": None},
                )
            ],
            "row": [("tr", {"data-node-id": payload}), ("td", {"class": "mono"})],
            "link": [("a", {"href": payload})],
            "single": [("span", {"title": payload})],
            "text": [("code", {})],
        }
        for shape, tags in expected.items():
            parsed = Parsed(built[shape])
            assert parsed.tags == tags, (shape, built[shape])
        assert Parsed(built["text"]).text == f"{payload} {payload}"
        assert Parsed(built["row"]).text == payload


def test_every_dashboard_script_escapes_with_the_one_helper():
    """No script keeps a text-only escaper (text into ``textContent``, ``innerHTML`` read back as its escape):
    every script escapes with app.js's one helper. On the old code app.js's ``escapeText`` was that escaper."""
    for script in sorted(STATIC.glob("*.js")):
        assert "escapeText" not in script.read_text(), script.name
        assert ".innerHTML;" not in script.read_text(), script.name
