"""The docs stay a short read that stands alone (issue 30): the README at most 6,000 characters,
docs/ at most 60,000 in all; no reference to files outside the repository; every citation of
a docs section (``docs/NAME.md, "Heading"``) in code, configs and docs names a heading (or a
bold paragraph lead) that exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP = {".venv", ".git", "node_modules"}
CITE = re.compile(r'docs/(\w+)\.md,?\s*(?:#\s*)?["\u201c]([^"\u201d]+)["\u201d]')


def _files(suffixes: tuple[str, ...]) -> list[Path]:
    return [p for p in REPO.rglob("*") if p.suffix in suffixes and p.is_file()
            and not SKIP & set(p.relative_to(REPO).parts)]


def test_readme_and_docs_fit_their_budget():
    readme = len((REPO / "README.md").read_text())
    docs = sum(len(p.read_text()) for p in (REPO / "docs").glob("*.md"))
    assert readme <= 6_000, f"README.md has {readme} characters (budget 6,000)"
    assert docs <= 60_000, f"docs/*.md have {docs} characters (budget 60,000)"


def test_nothing_cites_files_outside_the_repository():
    outside = re.compile(r"DESIGN\.md|RAY_GUIDE|STYLE\.md|\.\./shared|/work/shared")
    hits = [f"{p.relative_to(REPO)}:{i}" for p in _files((".md", ".py", ".yaml", ".toml"))
            if p.name != "test_docs.py"
            for i, line in enumerate(p.read_text(errors="ignore").splitlines(), 1)
            if outside.search(line)]
    assert not hits, hits


def test_every_cited_docs_section_exists():
    docs = {p.stem: [re.sub(r"\s+", " ", line).lower() for line in p.read_text().splitlines()
                     if line.startswith(("#", "**"))]
            for p in (REPO / "docs").glob("*.md")}
    missing = []
    for p in _files((".md", ".py", ".yaml")):
        if p.name == "test_docs.py":
            continue
        for m in CITE.finditer(p.read_text(errors="ignore")):
            doc, head = m.group(1), re.sub(r"\s*#\s*", " ", m.group(2))
            key = re.sub(r"\s+", " ", head).strip().rstrip(".").lower()[:40]
            if doc not in docs or not any(key in line for line in docs[doc]):
                missing.append(f"{p.relative_to(REPO)}: docs/{doc}.md, {head!r}")
    assert not missing, missing
