"""The documentation stays true to the repository and to the command line.

- Every relative link in README.md, docs/*.md and deploy/**/*.md names a file that exists,
  and its anchor (``page.md#heading``) a heading of that page, as GitHub spells heading
  anchors; a page named in prose (``see docs/store.md``) exists too.
- Every ``bootseer ...`` command in a code block of README.md parses with the real parser
  (``bootseer.cli.main.build_parser``) and names a verb that runs: the quickstart and the
  examples stay in step with the CLI.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from bootseer.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"),
                *(REPO / "deploy").rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`+[^`\n]*`+")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
MENTION = re.compile(r"(?<![\w./-])((?:docs|deploy)/[\w./-]*?\.md)\b")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)     # http:, https:, mailto: ...


def prose(text: str) -> str:
    """The page without its code: fenced blocks and inline code spans."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (hyphens and
    underscores kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())   # links: their text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a page's headings, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    text = FENCE.sub("", page.read_text())
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, re.MULTILINE):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = prose(page.read_text())
    return [m.group(1) for m in LINK.finditer(text)] + REFERENCE.findall(text)


def broken(page: Path, target: str) -> str | None:
    """Why a relative link of ``page`` does not resolve (None: it does)."""
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return "no such file"
    if REPO not in dest.parents and dest != REPO:
        return "outside the repository"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading #{anchor} in {dest.relative_to(REPO)}"
    return None


def test_the_checked_pages_are_there():
    names = {str(p.relative_to(REPO)) for p in PAGES}
    assert {"README.md", "docs/benchmarks.md", "docs/comparison.md",
            "deploy/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    bad = [f"{target}: {why}" for target in links(page) if not EXTERNAL.match(target)
           for why in [broken(page, target)] if why]
    assert not bad, f"{page.relative_to(REPO)}: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_pages_named_in_prose_exist(page):
    named = set(MENTION.findall(prose(page.read_text())))
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, f"{page.relative_to(REPO)} names missing pages: {missing}"


def test_deploy_readme_lists_every_file_in_deploy():
    text = (REPO / "deploy/README.md").read_text()
    files = sorted(str(p.relative_to(REPO / "deploy")) for p in (REPO / "deploy").rglob("*")
                   if p.is_file() and p.name != "README.md")
    missing = [f for f in files if f"({f})" not in text]
    assert not missing, f"deploy/README.md does not link: {missing}"


def test_slug_matches_github():
    assert slug("Slurm: prolog and epilog") == "slurm-prolog-and-epilog"
    assert slug("`bootseer doctor`") == "bootseer-doctor"
    assert slug("Benchmark (`make bench-scale`)") == "benchmark-make-bench-scale"
    assert slug("What a node verifies") == "what-a-node-verifies"


# -- README commands ---------------------------------------------------------------------

def shell_commands(block: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped,
    split at ``; && || |`` and command substitutions, leading ``VAR=value`` words skipped."""
    text = block.replace("\\\n", " ")
    text = re.sub(r"\$\(|\)\"?|\"\$\(", " ; ", text)
    out = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token and set(token) <= set(";&|"):
                while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
                    words.pop(0)
                if words:
                    out.append(words)
                words = []
            else:
                words.append(token)
    return out


SHELL = {"sh", "bash", "shell", "console", ""}


def readme_bootseer_commands() -> list[list[str]]:
    """Every ``bootseer`` command of README.md's shell code blocks (fenced ``sh``, ``bash``,
    ``shell``, ``console`` or untagged); a block the shell could not read fails."""
    text = (REPO / "README.md").read_text()
    out = []
    for m in FENCE.finditer(text):
        info, body = m.group(0).split("\n", 1)
        if info.strip("`~ ").split(" ")[0].lower() not in SHELL:
            continue
        try:
            commands = shell_commands(body.rsplit("\n", 1)[0])
        except ValueError as e:
            pytest.fail(f"README.md: a code block the shell cannot read ({e}): {body[:80]!r}")
        out += [words[1:] for words in commands if words[0] == "bootseer"]
    return out


def test_shell_commands_split_as_the_shell_does():
    block = ('export A=1 && BOOTSEER_X=2 bootseer report t \\\n  --html r.html  # note\n'
             'eval "$(bootseer completion bash)"; make demo | tee log')
    assert shell_commands(block) == [["export", "A=1"],
                                     ["bootseer", "report", "t", "--html", "r.html"],
                                     ["eval"], ["bootseer", "completion", "bash"],
                                     ["make", "demo"], ["tee", "log"]]


def test_readme_shows_the_quickstart_commands():
    commands = [" ".join(argv) for argv in readme_bootseer_commands()]
    assert any(c.startswith("trace exec ") for c in commands), commands
    assert any(c.startswith("report ") and "--html" in c for c in commands), commands


@pytest.mark.parametrize("argv", readme_bootseer_commands(), ids=" ".join)
def test_readme_command_parses(argv, capsys):
    try:
        args, refused = build_parser().parse_args(argv), None
    except SystemExit as e:
        args, refused = None, e.code
    assert refused is None, (f"bootseer {shlex.join(argv)}: the parser refuses it (exit "
                             f"{refused}): {capsys.readouterr().err.strip()}")
    assert getattr(args, "func", None), f"bootseer {shlex.join(argv)}: not a whole command"
