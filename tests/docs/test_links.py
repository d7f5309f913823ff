"""The documentation's relative links lead somewhere: every linked file exists, every `#anchor`
names a heading of its target (by GitHub's slug rule), and the README stays a front page."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
DOC_FILES = [
    README,
    *sorted((REPO_ROOT / "docs").glob("*.md")),
    REPO_ROOT / "app" / "README.md",
    REPO_ROOT / "admin_ui" / "README.md",
]
README_MAX_LINES = 250

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the text may wrap lines and hold one level of brackets.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)


@dataclass(frozen=True)
class Link:
    """One relative link of a markdown file: the file it is in, its line and its target."""

    source: Path
    line: int
    target: str

    @property
    def path(self) -> Path:
        """The linked file; the source itself for a bare `#anchor`."""
        path_part = self.target.split("#", 1)[0]
        return (self.source.parent / path_part).resolve() if path_part else self.source

    @property
    def anchor(self) -> str | None:
        return self.target.split("#", 1)[1] if "#" in self.target else None

    def __str__(self) -> str:
        return f"{self.source.relative_to(REPO_ROOT)}:{self.line} -> {self.target}"


def _without_code(text: str) -> str:
    """The text with fenced blocks and code spans blanked (line breaks kept, so line numbers
    stay right): what looks like a link inside code is not one."""
    text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def relative_links(md_file: Path) -> list[Link]:
    """The links of a markdown file that stay in this repository (no URL scheme)."""
    text = _without_code(md_file.read_text())
    return [
        Link(md_file, text.count("\n", 0, m.start()) + 1, m.group(1))
        for m in _LINK.finditer(text)
        if not _SCHEME.match(m.group(1))
    ]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (links reduced to their text) lower-cased,
    everything but letters, digits, `_`, `-` and spaces dropped, spaces turned into `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def heading_anchors(md_file: Path) -> set[str]:
    """Every anchor of a markdown file's headings; a repeated slug gets `-1`, `-2`, ... as on
    GitHub."""
    text = _FENCE.sub("", md_file.read_text())
    seen: dict[str, int] = {}
    anchors = set()
    for m in _HEADING.finditer(text):
        slug = github_slug(m.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _file_id(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@pytest.mark.parametrize(
    "heading, slug",
    [
        ("Sizing with `officellm plan`", "sizing-with-officellm-plan"),
        ("`--quantization`, `-q`", "--quantization--q"),
        ("Against llama.cpp's llama-server on an Intel Xeon",
         "against-llamacpps-llama-server-on-an-intel-xeon"),
        ("The same comparison on an AMD EPYC (Zen 4)", "the-same-comparison-on-an-amd-epyc-zen-4"),
        ("1. What the user gets", "1-what-the-user-gets"),
        ("Admin API (`/admin/`)", "admin-api-admin"),
        ("See [the guide](guide.md)", "see-the-guide"),
    ],
)
def test_github_slug(heading: str, slug: str):
    assert github_slug(heading) == slug


def test_repeated_headings_get_numbered_anchors(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# Tabs\n\n```\n# not a heading\n```\n\n## Tabs\n\n### Tabs ##\n")
    assert heading_anchors(page) == {"tabs", "tabs-1", "tabs-2"}


@pytest.mark.parametrize("md_file", DOC_FILES, ids=_file_id)
def test_relative_links_point_to_existing_files(md_file: Path):
    broken = [str(link) for link in relative_links(md_file) if not link.path.exists()]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("md_file", DOC_FILES, ids=_file_id)
def test_anchors_point_to_existing_headings(md_file: Path):
    broken = []
    for link in relative_links(md_file):
        if link.anchor is None or not link.path.exists():
            continue  # a missing file is the test above's failure
        if link.path.suffix != ".md" or link.anchor not in heading_anchors(link.path):
            broken.append(str(link))
    assert not broken, "anchors that name no heading of their target:\n" + "\n".join(broken)


def test_readme_is_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines: it is the front page; move detail into docs/"
    )
