"""Every relative link of README.md and docs/*.md leads somewhere: the file exists, and its
#anchor is a heading of that page as GitHub names it. No Django, no database."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code spans (neither holds links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (word characters, spaces
    and hyphens stay), each space a hyphen."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    heading = heading.strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings; a repeated one gets -1, -2, ... as on GitHub."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.DOTALL | re.MULTILINE)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.MULTILINE):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: ... are not checked


def test_the_slug_rules():
    assert slug("Python agents: `taskflow_client` (standard library only)") == \
        "python-agents-taskflow_client-standard-library-only"
    assert slug("Serving: why uvicorn workers and Django's WSGI handler") == \
        "serving-why-uvicorn-workers-and-djangos-wsgi-handler"
    assert slug("Where does it happen?") == "where-does-it-happen"
    assert slug("2. Log in") == "2-log-in"


def test_the_checker_finds_links_and_skips_code():
    page = "[a](x.md) `[b](y.md)` ![img](z.png) [c](https://e.org) [d](#e \"title\")\n```\n[f](g.md)\n```\n"
    found = [t for t in LINK.findall(prose(page)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    assert found == ["x.md", "#e"]


def test_the_readme_links_to_the_docs():
    linked = {target.split("#")[0] for target in relative_links(ROOT / "README.md")}
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= linked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {where.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: " + "; ".join(broken)
