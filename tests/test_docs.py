"""The documentation's shape: a short README that reaches every page of the site (``docs/``)
within two clicks, and pages that open with the task they serve.

The site's own links, anchors and API references are checked by ``mkdocs build --strict``
(``make lint``); the code blocks run through pytest-markdown-docs and ``tests/test_readme.py``.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
LINK = re.compile(r"\]\(([^)\s#]+\.md)(?:#[^)\s]*)?\)")


def _linked_pages(path: Path) -> set[Path]:
    """The pages of docs/ that a Markdown file links to (relative links only)."""
    base = posixpath.dirname(str(path.relative_to(REPO)))
    targets = set()
    for link in LINK.findall(path.read_text()):
        if "://" not in link:
            targets.add(REPO / posixpath.normpath(posixpath.join(base, link)))
    return {target for target in targets if DOCS in target.parents}


def test_readme_is_short_and_says_it_is_about_ids() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the details belong in docs/"
    assert "not the Snowflake data warehouse" in lines[0], lines[0]


def test_readme_shows_the_commands_ci_runs() -> None:
    """``.ci/run`` runs ``make test`` as the README tells a newcomer to."""
    text = README.read_text()
    assert "\n$ make demo\n" in text and "\n$ make test\n" in text
    assert re.search(r"^make test$", (REPO / ".ci/run").read_text(), re.MULTILINE)


def test_every_page_is_within_two_clicks_of_the_readme() -> None:
    first = _linked_pages(README)
    assert first, "README.md links to no page of docs/"
    second = set().union(*(_linked_pages(page) for page in first))
    missing = [str(page.relative_to(REPO)) for page in PAGES if page not in first | second]
    assert not missing, f"pages more than two clicks from README.md: {missing}"
    broken = [str(page.relative_to(REPO)) for page in first | second if not page.exists()]
    assert not broken, f"links to missing pages: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(DOCS)))
def test_every_page_opens_with_its_title_and_task(page: Path) -> None:
    paragraphs = page.read_text().split("\n\n")
    assert re.fullmatch(r"# \S.*", paragraphs[0]), f"{page}: no title on its first line"
    opening = paragraphs[1] if len(paragraphs) > 1 else ""
    assert opening and not opening.startswith(("#", "```", "|", "-", ":::")), (
        f"{page}: the title is not followed by a sentence saying what the page is for"
    )
