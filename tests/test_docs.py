"""The documentation cannot rot: the reference pages in docs/ build with `mkdocs build
--strict` (a broken link, a missing anchor or a page left out of the nav is a warning, and a
warning fails the build), every relative link of README.md names a file and heading that
exist, and ARCHITECTURE.md has a line for every module of the tree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _outside_code(text: str) -> str:
    """The text without fenced code blocks and inline code spans (no links there)."""
    lines, fence = [], None
    for line in text.splitlines():
        marker = re.match(r"^\s*(```|~~~)", line)
        if marker:
            fence = None if fence == marker.group(1) else (fence or marker.group(1))
            continue
        if fence is None:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub (and mkdocs' toc, for these headings) gives a file's headings."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fence = None
    for line in markdown.splitlines():
        marker = re.match(r"^\s*(```|~~~)", line)
        if marker:
            fence = None if fence == marker.group(1) else (fence or marker.group(1))
            continue
        found = _HEADING.match(line) if fence is None else None
        if not found:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", found.group(2)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def relative_links(markdown: str) -> list[str]:
    return [target for target in _LINK.findall(_outside_code(markdown))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)]


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict`: links between pages, their anchors and the nav all resolve
    (mkdocs is in the `test` extra: a missing mkdocs fails here, it is never skipped)."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "WARNING" not in output, output
    assert (tmp_path / "site" / "index.html").exists()


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages, "no pages in docs/"
    missing = [p for p in pages if not re.search(rf":\s*{re.escape(p)}\s*$", nav, re.M)]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


@pytest.mark.parametrize("name", ["README.md", "ARCHITECTURE.md"])
def test_relative_links_resolve(name: str) -> None:
    """Every relative link (and image) of the file names an existing file, and an existing
    heading where it names an anchor."""
    source = ROOT / name
    broken = []
    links = relative_links(source.read_text("utf-8"))
    for target in links:
        path, _, anchor = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text("utf-8")):
            broken.append(f"{target}: no heading with anchor #{anchor} in {path or name}")
    assert not broken, f"{name}: broken links:\n" + "\n".join(broken)
    if name == "README.md":
        assert "docs/report.png" in links


def test_readme_keeps_the_two_commands() -> None:
    """The front door's set-up: the two make targets it names exist in the Makefile."""
    readme = (ROOT / "README.md").read_text("utf-8")
    makefile = (ROOT / "Makefile").read_text("utf-8")
    for target in ("demo", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, re.M), f"no `{target}` target in the Makefile"


def _modules() -> list[str]:
    patterns = ["evalsnap/*.py", "storage/*.py", "tasks/*.py", "flows/*.py"]
    try:
        listed = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                                text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    if not listed:  # not a git checkout: the files on disk
        listed = [str(p.relative_to(ROOT)) for pat in ("evalsnap", "storage", "tasks", "flows")
                  for p in (ROOT / pat).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(m for m in listed if (ROOT / m).exists())


def test_architecture_names_every_module() -> None:
    """ARCHITECTURE.md matches the tree: each module appears, in backticks, in the section of
    its package (`## \\`evalsnap/adk/\\` …`), and each module it names exists."""
    text = (ROOT / "ARCHITECTURE.md").read_text("utf-8")
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        found = re.match(r"^##\s+`([\w/]+/)`", line)
        if found:
            current = found.group(1)
            sections[current] = ""
        elif line.startswith("## "):
            current = None
        elif current is not None:
            sections[current] += line + "\n"
    missing = []
    for module in _modules():
        home = max((d for d in sections if module.startswith(d)), key=len, default=None)
        rel = module[len(home):] if home else module
        if home is None or f"`{rel}`" not in sections[home]:
            missing.append(module)
    assert not missing, f"ARCHITECTURE.md has no line for: {missing}"
    named = [(d, m) for d, body in sections.items() for m in re.findall(r"`([\w/]+\.py)`", body)]
    gone = [d + m for d, m in named
            if not any((ROOT / base / m).exists() for base in (d, "", "evalsnap"))]
    assert not gone, f"ARCHITECTURE.md names modules that do not exist: {gone}"
