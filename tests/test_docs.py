"""The documentation's structure: the README is the front page (at most 250 lines), every page of the manual
(docs/*.md but docs/notes and docs/results) is reachable from it, and every relative link of the README and those
pages points at a file that exists, and at a heading of a Markdown file where it names an anchor (GitHub's slugs).
Their commands and examples: test_readme.py."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from snakemake_helpers import REPO, doc_pages

README_MAX_LINES = 250
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
PAGES = doc_pages()


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation but '-' and '_' dropped, spaces '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks), repeated ones numbered as GitHub does."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.DOTALL | re.MULTILINE)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.MULTILINE):
        slug = github_slug(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def links(page: Path) -> list[str]:
    """The link targets of a page's prose (code blocks and inline code left out)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


def resolve(page: Path, target: str) -> tuple[Path, str]:
    """The file and the anchor a relative link of `page` names."""
    path, _, anchor = unquote(target).partition("#")
    return (page if not path else (page.parent / path).resolve()), anchor


def test_github_slugs():
    assert github_slug("E6 routes: GPU kernel, CPU BLAS kernel, Nystroem") == \
        "e6-routes-gpu-kernel-cpu-blas-kernel-nystroem"
    assert github_slug("E3's measures") == "e3s-measures"
    assert github_slug("Outputs (`results/`, git-ignored)") == "outputs-results-git-ignored"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    """Each relative link points at a file or folder of the checkout; an anchor into a Markdown file names one of
    its headings. Links to other sites are not followed."""
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, anchor = resolve(page, target)
        if not path.exists() or not path.is_relative_to(REPO):
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading '#{anchor}' in {path.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_every_page_is_reached_from_the_readme():
    """Every page of the manual is linked from the README or from a page linked from it (at any depth)."""
    reached, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        for target in links(page):
            path, _ = resolve(page, target)
            if path in PAGES:
                todo.append(path)
    assert not set(PAGES) - reached, sorted(str(p.relative_to(REPO)) for p in set(PAGES) - reached)
    assert len(PAGES) > 5  # the manual's pages are found


def test_the_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the detail into docs/"


def test_the_readmes_links_into_the_results_resolve():
    """The README's links into docs/results (the generated Results section's) point at published files."""
    targets = [t for t in links(REPO / "README.md") if t.startswith("docs/results/")]
    assert targets and all((REPO / t.partition("#")[0]).exists() for t in targets), targets


# every ```python block of the README and the manual, by a line only it holds: the test that runs it
PYTHON_EXAMPLES = {"SoftmaxCrossEntropy": "test_readme.py::test_the_layers_example_runs",
                   'Trainer(model, "cuda"': "test_api.py::test_readme_gpu_example_runs",
                   '"""E7: ': "test_extend.py (the worked example of a new experiment)"}


def test_every_python_example_is_run_by_a_test():
    """A new ```python block fails here until a test runs it and PYTHON_EXAMPLES names that test."""
    blocks = [(page.relative_to(REPO), block) for page in PAGES
              for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)]
    unrun = [f"{page}: {block.splitlines()[0]}" for page, block in blocks
             if sum(marker in block for marker in PYTHON_EXAMPLES) != 1]
    assert not unrun, f"python examples no test runs (add a test and its marker to PYTHON_EXAMPLES): {unrun}"
    for marker in PYTHON_EXAMPLES:
        assert sum(marker in block for _, block in blocks) == 1, marker
