"""The README's parts that tests run or check: its fenced code blocks under a heading, its
text blocks, its links."""

from __future__ import annotations

import os
import re

from helpers import REPO

README = os.path.join(REPO, "README.md")


def text() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def section(heading: str) -> str:
    """The README's text under ``## heading``, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text(), re.S | re.M)
    assert match, f"the README has no section {heading!r}"
    return match.group(1)


def code_blocks(heading: str, language: str) -> list[str]:
    """The fenced ``language`` blocks of the section ``heading``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", section(heading), re.S | re.M)


def blocks() -> list[str]:
    """The README's text blocks (paragraphs, lists, tables, code), separated by blank lines."""
    return [block for block in re.split(r"\n\s*\n", text()) if block.strip()]
