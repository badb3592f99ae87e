"""The documentation's shape: a short README that reaches every page of the site (``docs/``)
within two clicks, every page in the site's navigation, pages that open with the task they
serve, and task pages without paragraphs over 150 words.

The site's own links, anchors and API references are checked by ``zensical build --strict``
(``make lint``); the code blocks run through pytest-markdown-docs and ``tests/docs/test_readme.py``.
"""

from __future__ import annotations

import itertools
import posixpath
import re
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[2]
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


#: The pages a user starts on: each opens with a recipe and keeps its paragraphs short.
TASK_PAGES = [README, DOCS / "index.md", *sorted(
    page for folder in ("getting-started", "converting", "deploying")
    for page in (DOCS / folder).glob("*.md")
)]
#: The longest paragraph a task page may hold; a longer one mixes the main path with details
#: that belong under a heading of their own or on a reference page.
MAX_PARAGRAPH_WORDS = 150


def _paragraphs(text: str) -> list[tuple[int, str]]:
    """The paragraphs of a Markdown text, with their first line: prose only (code blocks,
    tables and headings are not paragraphs), and each item of a list a paragraph of its own
    (an item of several paragraphs, several)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    return [
        (opening.map[0] + 1 if opening.map else 0, inline.content)
        for opening, inline in itertools.pairwise(tokens)
        if opening.type == "paragraph_open" and inline.type == "inline"
    ]


def test_paragraphs_counts_prose_and_list_items_and_skips_code_and_tables() -> None:
    text = (
        "# Title\n\nOne two three.\n\n- item one\n- item two\n  still item two\n\n"
        "```python\nx = 1  # not a paragraph\n```\n\n| a | b |\n|---|---|\n| c | d |\n"
    )
    assert [words for _, words in _paragraphs(text)] == [
        "One two three.", "item one", "item two\nstill item two",
    ]
    assert [line for line, _ in _paragraphs(text)] == [3, 5, 6]


@pytest.mark.parametrize("page", TASK_PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_task_pages_have_no_paragraph_over_150_words(page: Path) -> None:
    long = [
        f"{page.relative_to(REPO)}:{line}: {len(words.split())} words"
        for line, words in _paragraphs(page.read_text())
        if len(words.split()) > MAX_PARAGRAPH_WORDS
    ]
    assert not long, (
        f"paragraphs over {MAX_PARAGRAPH_WORDS} words: {long}; open with the recipe, split the "
        "reasoning into a list or short paragraphs, move rare cases to a reference page"
    )


class _ConfigLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose ``!ENV`` tags name environment variables."""


_ConfigLoader.add_constructor("!ENV", lambda loader, node: None)


def _nav_pages(entries: object) -> set[str]:
    """The pages named in mkdocs.yml's ``nav``, at any depth."""
    if isinstance(entries, str):
        return {entries}
    if isinstance(entries, list):
        return set().union(*(_nav_pages(entry) for entry in entries))
    if isinstance(entries, dict):
        return set().union(*(_nav_pages(value) for value in entries.values()))
    return set()


def test_every_page_is_in_the_site_navigation() -> None:
    """Zensical, which builds the site, does not report a page left out of ``nav`` (MkDocs's
    ``omitted_files`` did), so this test does."""
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=_ConfigLoader)
    in_nav = _nav_pages(config["nav"])
    pages = {str(page.relative_to(DOCS)) for page in PAGES}
    assert pages - in_nav == set(), f"pages missing from mkdocs.yml's nav: {pages - in_nav}"
    assert in_nav - pages == set(), f"nav entries without a page: {in_nav - pages}"
