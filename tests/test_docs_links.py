"""README.md and docs/*.md link only to files in the repository (a fresh clone can follow them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Inline links and images, [text](target "title"), and reference definitions, [label]: target.
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_EXTERNAL = ("http://", "https://", "mailto:")


def links(text: str) -> list[str]:
    """Every link target in a Markdown text."""
    return _INLINE.findall(text) + _REFERENCE.findall(text)


def broken_links(document: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``document`` that leave ``root`` or name no file in it."""
    broken = []
    for target in links(document.read_text()):
        if target.startswith(_EXTERNAL) or target.startswith("#"):
            continue
        path = (document.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(root) or not path.exists():
            broken.append(target)
    return broken


def test_the_checker_finds_broken_links(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "here.md").write_text("")
    page = docs / "page.md"
    page.write_text(
        "[ok](here.md) [anchor](#x) [web](https://example.org) [ok too](here.md#part)\n"
        "[missing](missing.md) ![img](pic.png)\n[ref]: nowhere.md\n"
    )
    assert broken_links(page, root=tmp_path) == ["missing.md", "pic.png", "nowhere.md"]
    page.write_text("[design](../../shared/DESIGN.md)")
    assert broken_links(page, root=tmp_path) == ["../../shared/DESIGN.md"]  # outside the repository


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository(document: Path) -> None:
    assert broken_links(document) == [], f"{document.name}: fix or remove these links"
    assert "../shared" not in document.read_text(), f"{document.name} points to ../shared, outside the repository"


def test_the_docs_exist() -> None:
    names = {p.name for p in DOCUMENTS}
    assert {"README.md", "architecture.md", "operations.md", "growth-benchmark.md"} <= names
