"""Checks that every pointer into docs/ names a file and a section that exist.

A pointer is `docs/<name>.md` in a tracked source, script, test, manifest or
document (or `NAME.md` as a Markdown link target inside docs/), optionally
followed by a section: `, "Section"`, ` ("Section")` or, unquoted, `, Section)`.
A section exists when a heading of the named file is that text, or starts
with it followed by ":" or " (" (so "Lever 4" names "Lever 4: attention").
Also checks that docs/ and README.md link nowhere outside the repository
(an http(s) address other than a local one). Prints each broken pointer as
`path:line: what is wrong` and exits 1 if there is any; standard library only.
"""

from __future__ import annotations

import bisect
import functools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where pointers are looked for (git pathspecs).
SCANNED = [
    "rust",
    "frontend-bin",
    "python",
    "bench",
    "scripts",
    "tests",
    "docs",
    "packaging",
    "Cargo.toml",
    "pyproject.toml",
    "README.md",
    "requirements-dev.txt",
]
#: Files whose broken pointers are on purpose: the checker's own test cases.
EXEMPT = {"tests/test_docs_refs.py"}
#: Comment leaders that a pointer's section may be wrapped across.
_CONTINUATION = re.compile(r"[ \t]*\n[ \t]*(?://[/!]?|#+|\*|--)?[ \t]*")
_POINTER = re.compile(
    r"(?:docs/([\w./-]+\.md)|\]\(([\w./-]+\.md)\))`?"
    r"(?:,\s*\"([^\"]+)\"|\s*\(\"([^\"]+)\"\)|,\s*([A-Z][\w' -]*?)\))?"
)
#: A remote address outside code spans (a default value in backticks is not a link).
_REMOTE = re.compile(r"(?<!`)https?://(?!localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\])[^\s)`'\"]+")
_HEADING = re.compile(r"^#+\s+(.*?)\s*$", re.MULTILINE)


def _plain(title: str) -> str:
    """A heading or section name without Markdown backticks or stray spaces."""
    return " ".join(title.replace("`", "").split())


@functools.cache
def headings(doc: Path) -> list[str]:
    """The headings of a Markdown file, outside fenced code blocks."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [_plain(h) for h in _HEADING.findall(text)]


def names_section(section: str, titles: list[str]) -> bool:
    """Whether `section` is one of `titles`, or the part before ": " or " (" of one."""
    section = _plain(section)
    return any(t == section or t.startswith(section + ":") or t.startswith(section + " (") for t in titles)


def tracked_files() -> list[Path]:
    """The tracked text files under `SCANNED`."""
    out = subprocess.run(["git", "ls-files", "--", *SCANNED], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.splitlines() if line not in EXEMPT and (ROOT / line).is_file()]


def problems_in(path: Path) -> list[str]:
    """Every broken pointer and remote link in one file, as `path:line: problem`."""
    try:
        raw = path.read_text()
    except UnicodeDecodeError:
        return []
    rel = path.relative_to(ROOT).as_posix()
    found = []
    # Join the lines of a wrapped comment so a section split across lines is
    # read whole; offsets map back to line numbers through `starts`.
    pieces, starts, pos, length, line = [], [], 0, 0, 1
    for match in _CONTINUATION.finditer(raw):
        starts.append((length, line))
        pieces.append(raw[pos : match.start()] + " ")
        length += len(pieces[-1])
        line += raw.count("\n", pos, match.end())
        pos = match.end()
    starts.append((length, line))
    pieces.append(raw[pos:])
    joined = "".join(pieces)

    offsets = [start for start, _ in starts]

    def line_of(offset: int) -> int:
        return starts[bisect.bisect_right(offsets, offset) - 1][1]

    for match in _POINTER.finditer(joined):
        name, linked = match.group(1), match.group(2)
        if linked is not None:
            if not rel.startswith("docs/") or "/" in linked:
                continue
            target = path.parent / linked
            shown = (path.parent / linked).relative_to(ROOT).as_posix()
        else:
            target, shown = ROOT / "docs" / name, f"docs/{name}"
        section = match.group(3) or match.group(4) or match.group(5)
        where = f"{rel}:{line_of(match.start())}"
        if not target.is_file():
            found.append(f"{where}: {shown} does not exist")
        elif section and not names_section(section, headings(target)):
            found.append(f'{where}: {shown} has no section "{_plain(section)}"')
    # Markdown only: an SVG's namespace (xmlns="http://www.w3.org/...") names, it does not link.
    if rel.endswith(".md") and (rel.startswith("docs/") or rel == "README.md"):
        for match in _REMOTE.finditer(raw):
            found.append(
                f"{rel}:{raw.count(chr(10), 0, match.start()) + 1}: links outside the repository: {match.group()}"
            )
    return found


def main() -> int:
    """Checks every scanned file; prints the problems and returns 1 if any."""
    problems = [p for path in tracked_files() for p in problems_in(path)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
