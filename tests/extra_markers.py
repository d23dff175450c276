"""The extra markers of the project's text files, and the one rule that drops an extra's lines (the docs tests use it).

Lines between `<!-- extra:NAME -->` and `<!-- /extra:NAME -->` (Markdown), or `# extra:NAME` and `# /extra:NAME`
(Makefile, YAML, TOML), belong to the extra NAME of pyproject.toml's [tool.lightning_template.extras]: a project
without that extra has neither the lines nor the markers.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"^[ \t]*(?:<!--[ \t]*(/?)extra:([\w-]+)[ \t]*-->|#[ \t]*(/?)extra:([\w-]+))[ \t]*$")


def marker(line: str) -> tuple[bool, str] | None:
    """(closing, extra name) of a marker line, or None."""
    found = MARKER.match(line.rstrip("\r\n"))
    if not found:
        return None
    return (bool(found[1]), found[2]) if found[2] else (bool(found[3]), found[4])


def strip_extra_blocks(text: str, removed: set[str]) -> str:
    """The text without the blocks of the removed extras (their marker lines included); the blocks of other
    extras stay as they are, markers too. Blocks may nest; an unbalanced marker is an error. The blank lines that
    meet where a block was are as many as the longer of the two runs (one between paragraphs, two between Python's
    top-level definitions), not their sum."""
    kept: list[str] = []
    open_blocks: list[str] = []
    after_removal = False
    before = after = 0  # blank lines kept just before the removal, and seen just after it
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        found = marker(line)
        dropping = any(name in removed for name in open_blocks)
        if found:
            closing, name = found
            if closing:
                if not open_blocks or open_blocks[-1] != name:
                    raise ValueError(f"line {number}: /extra:{name} closes no open extra:{name} block")
                open_blocks.pop()
            else:
                open_blocks.append(name)
            if dropping or name in removed:
                after_removal, after = True, 0
                continue
        elif dropping:
            after_removal, after = True, 0
            continue
        blank = not line.strip()
        if not after_removal:
            before = before + 1 if blank else 0
        elif blank:
            after += 1
            if after <= before or not kept:  # the run before the block already has this one
                continue
            before += 1
        else:
            after_removal, before = False, 0
        kept.append(line)
    if open_blocks:
        raise ValueError(f"extra:{open_blocks[-1]} block is never closed")
    return "".join(kept)


def markers_in(text: str) -> set[str]:
    """The extra names the text's markers name."""
    return {found[1] for line in text.splitlines() if (found := marker(line))}
