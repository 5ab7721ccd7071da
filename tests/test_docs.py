"""The README and the pages under docs/: every relative link resolves, to a file that exists and,
where it names an anchor, to a heading of that file; the README stays short and links every
page. Reads files only (no build, no torch)."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 300

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
BACKTICKS = re.compile(r"`+")
# [text](target) or [text](target "title"); the text may run over lines.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def outside_code_blocks(text):
    """The lines of text, with those inside fenced code blocks (and the fences) blanked."""
    lines, fence = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            lines.append("")
        elif fence is not None:
            if re.fullmatch(rf" {{0,3}}{fence[0]}{{{len(fence)},}}\s*", line):
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return lines


def without_code_spans(text):
    """text with its code spans removed (their line breaks kept): a run of backticks up to the
    next run of as many, across lines but not across a blank line (an unmatched run stays)."""
    out, i = [], 0
    while m := BACKTICKS.search(text, i):
        closing = re.compile(rf"(?<!`){m.group(0)}(?!`)")
        end = closing.search(text, m.end())
        if end and "\n\n" not in text[m.end() : end.start()]:
            out.append(text[i : m.start()] + "\n" * text.count("\n", m.start(), end.end()))
            i = end.end()
        else:
            out.append(text[i : m.end()])
            i = m.end()
    return "".join(out) + text[i:]


def slug(heading):
    """GitHub's anchor for a heading: its text as rendered (links to their text, code spans to
    their contents, emphasis marks dropped), lowercased, every character but letters, digits,
    '_', '-' and spaces removed, then each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor a link may name in the file: its headings' slugs (a repeated one numbered
    -1, -2, ... as GitHub does) and explicit <a name/id> anchors."""
    found, seen = set(), {}
    text = path.read_text(encoding="utf-8")
    for line in outside_code_blocks(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    found.update(HTML_ANCHOR.findall(text))
    return found


def links(path):
    """(line number, target) of every link in the file, outside code blocks and code spans."""
    lines = outside_code_blocks(path.read_text(encoding="utf-8"))
    text = without_code_spans("\n".join(lines))
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEFINITION):
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start(1)) + 1, m.group(1)))
    return sorted(found)


def broken_links(path, root=ROOT):
    """'file:line: target (why)' for each relative link of the file that does not resolve."""
    broken = []
    for line, target in links(path):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # http:, https:, mailto:, ...: not a file of this checkout
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{line}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            broken.append(f"{where} (no heading with that anchor in {dest.name})")
    return broken


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    assert DOCS, "no pages under docs/"
    linked = {
        (README.parent / unquote(target.partition("#")[0])).resolve()
        for _, target in links(README)
        if not SCHEME.match(target)
    }
    assert [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in linked] == []


def test_slugs_follow_githubs_rules():
    assert slug("NCCL's memory: `mem_allocator` and `register_mem_pool`") == (
        "nccls-memory-mem_allocator-and-register_mem_pool"
    )
    assert slug("Beyond gloo and the built-in nccl") == "beyond-gloo-and-the-built-in-nccl"
    assert slug("Opening Gloo at a group's first CPU op") == "opening-gloo-at-a-groups-first-cpu-op"
    assert slug("`all_to_all_single`") == "all_to_all_single"
    assert slug("Set-up, build and test times") == "set-up-build-and-test-times"
    assert slug("See [the ops](ops.md)") == "see-the-ops"


def test_the_checker_finds_broken_links_and_ignores_code(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## Twice\n\n## Twice\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md#twice-1) [also fine](#page) [web](https://example.com/x.md)\n"
        "[no file](missing.md) [no anchor](other.md#nowhere)\n"
        "[over\ntwo lines](other.md#twice-2) `[in a code span](missing.md)`\n"
        "`a code span\nover two lines` [after it](missing.md) ``a `tick` [in](missing.md)``\n\n"
        "````\n```python\n[in a code block](missing.md)\n```\n````\n",
        encoding="utf-8",
    )
    assert broken_links(page, root=tmp_path) == [
        "page.md:4: missing.md (no such file)",
        "page.md:4: other.md#nowhere (no heading with that anchor in other.md)",
        "page.md:6: other.md#twice-2 (no heading with that anchor in other.md)",
        "page.md:8: missing.md (no such file)",
    ]
