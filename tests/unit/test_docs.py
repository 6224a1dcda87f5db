"""The documentation: links resolve, nothing links out of the repository but public sites, every shell block
is run by a test or marked as an example, and the generated pages are current (docs/testing.md says how)."""

from __future__ import annotations

import importlib.util
import ipaddress
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN_DOCS = ROOT / "scripts" / "gen_docs.py"
REGENERATE = ".venv/bin/python scripts/gen_docs.py"

FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]+)>")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SHELL_LANGUAGES = {"bash", "sh", "shell", "console", "zsh"}
EXAMPLE = "<!-- example -->"
TESTED = re.compile(r"^<!-- tested: (.+) -->$")


def markdown_files() -> list[Path]:
    """The repository's Markdown files: tracked ones and new ones git does not ignore."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.md"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        files = [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the documentation tree itself
        files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return sorted(path for path in files if path.is_file())


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans removed."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            marker = match.group(1)
            if fence is None:
                fence = marker
                continue
            if marker[0] == fence[0] and len(marker) >= len(fence) and not match.group(2).strip():
                fence = None
                continue
        if fence is None:
            lines.append((number, re.sub(r"(`+)(.+?)\1", "", line)))
    return lines


def links(text: str) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(text):
        found += [(number, m.group(1)) for m in INLINE_LINK.finditer(line)]
        found += [(number, m.group(1)) for m in AUTOLINK.finditer(line)]
        match = REFERENCE_DEF.match(line)
        if match:
            found.append((number, match.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    heading = heading.replace("`", "").strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    text = path.read_text()
    for _, line in prose_lines(text):
        result.update(HTML_ANCHOR.findall(line))
    fence = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match:
            fence = None if fence else match.group(1)
            continue
        heading = HEADING.match(line)
        if fence is None and heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def public_site(url: str) -> str | None:
    """None when url is an http(s) address of a public site, else why not."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme!r} (only http and https leave the repository)"
    host = (parts.hostname or "").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if host == "localhost" or host.endswith((".localhost", ".local", ".internal", ".svc")) or "." not in host:
            return f"host {host!r} is not a public site"
        return None
    if not address.is_global:
        return f"address {host} is not a public site"
    return None


def link_problems(path: Path) -> list[str]:
    problems = []
    for number, target in links(path.read_text()):
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            why = public_site(target)
            if why:
                problems.append(f"{where}: {why}")
            continue
        if target.startswith("/"):
            problems.append(f"{where}: an absolute path (use a path relative to the file)")
            continue
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part.split("?", 1)[0])
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{where}: leaves the repository")
            continue
        if not resolved.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            problems.append(f"{where}: no heading or anchor #{anchor} in {resolved.relative_to(ROOT)}")
    return problems


def shell_block_problems(path: Path) -> list[str]:
    """A shell block must follow `<!-- example -->` or `<!-- tested: <test file> ... -->` (docs/testing.md)."""
    problems, fence, previous = [], None, ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if match and fence is None:
            fence = match.group(1)
            language = (match.group(2).strip().split() or [""])[0].lower()
            if language in SHELL_LANGUAGES:
                marker = previous.strip()
                tested = TESTED.match(marker)
                where = f"{path.relative_to(ROOT)}:{number}"
                if tested:
                    missing = [p for p in tested.group(1).split() if not (ROOT / p).exists()]
                    if missing:
                        problems.append(f"{where}: the marker names no such test: {', '.join(missing)}")
                elif marker != EXAMPLE:
                    problems.append(
                        f"{where}: a {language} block needs `{EXAMPLE}` or `<!-- tested: tests/... -->` on the line before"
                    )
            continue
        if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
            fence = None
        if line.strip():
            previous = line
    return problems


def documentation() -> list[Path]:
    """The pages the code-block convention applies to: every Markdown file of the repository."""
    return markdown_files()


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_docs", GEN_DOCS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_relative_link_and_anchor_resolves_and_nothing_links_outside_but_public_sites():
    files = markdown_files()
    assert ROOT / "README.md" in files
    problems = [problem for path in files for problem in link_problems(path)]
    assert not problems, "broken or outside links:\n" + "\n".join(problems)


def test_every_shell_block_is_tested_or_marked_as_an_example():
    problems = [problem for path in documentation() for problem in shell_block_problems(path)]
    assert not problems, "unmarked shell blocks (see docs/testing.md):\n" + "\n".join(problems)


def test_readme_stays_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 220, f"README.md has {lines} lines: move detail into docs/ (about 200 at most)"


@pytest.mark.parametrize("page", ["configuration.md", "rest-api.md"])
def test_generated_pages_are_current(page):
    generator = load_generator()
    path = ROOT / "docs" / page
    expected = generator.render_configuration() if page == "configuration.md" else generator.render_rest_api()
    current = path.read_text() if path.exists() else ""
    assert current == expected, f"docs/{page} is stale: run `{REGENERATE}` and commit the result"


# --- the checker checks: each rule fails on what it must refuse ---


def test_the_checker_refuses_broken_outside_and_private_links(monkeypatch):
    page = ROOT / "docs" / "security.md"  # any page inside the repository: targets resolve from docs/
    text = (
        "[a](../README.md) [b](../README.md#5-minute-walkthrough) [c](https://docs.ray.io/en/latest/)\n"
        "[d](nope.md) [e](../../shared/DESIGN.md) [f](http://127.0.0.1:8000/docs) [g](../README.md#nope)\n"
        "[h](/etc/passwd) [i](file:///etc/passwd) `[j](not-a-link.md)`\n"
        "```\n[k](inside-a-fence.md)\n```\n"
    )
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if self == page else _read(self))
    problems = link_problems(page)
    flagged = {p.split(": ")[1] for p in problems}
    assert flagged == {
        "nope.md",
        "../../shared/DESIGN.md",
        "http://127.0.0.1:8000/docs",
        "../README.md#nope",
        "/etc/passwd",
        "file:///etc/passwd",
    }, problems


def test_the_checker_refuses_an_unmarked_shell_block(monkeypatch):
    page = ROOT / "docs" / "testing.md"
    text = (
        "<!-- example -->\n```bash\nok\n```\n\n<!-- tested: tests/e2e/test_walkthrough.py -->\n\n```sh\nok\n```\n"
        "```json\n{}\n```\nrun this:\n```bash\nbad\n```\n<!-- tested: tests/nope.py -->\n```bash\nbad\n```\n"
    )
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if self == page else _read(self))
    problems = shell_block_problems(page)
    assert [p.split(":")[1] for p in problems] == ["15", "19"], problems


def test_anchors_follow_github_slugs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# The two commands\n## `make test`: what runs\n## Sweeps\n## Sweeps\n```\n# not a heading\n```\n")
    assert anchors(page) == {"the-two-commands", "make-test-what-runs", "sweeps", "sweeps-1"}


_original_read_text = Path.read_text


def _read(path: Path) -> str:
    return _original_read_text(path)
