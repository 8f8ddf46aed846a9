"""The package's long description: README.md with its relative links made absolute.

In the repository the README links docs/ and deploy/ relatively, which GitHub resolves;
on the package index those links would point nowhere, so the wheel and sdist carry a copy
whose relative links name the same files in the repository on GitHub."""

from __future__ import annotations

import re
from pathlib import Path

from hatchling.metadata.plugin.interface import MetadataHookInterface

REPOSITORY = "https://github.com/bootseer/bootseer/blob/main/"
# a Markdown link or image target: ](target) or ](<target>), optionally with a title
LINK = re.compile(r"(\]\(\s*<?)([^)\s>]+)")
ABSOLUTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)", re.IGNORECASE)


def absolute_links(text: str, base: str = REPOSITORY) -> str:
    """``text`` with each relative link target prefixed by ``base`` (anchors within the
    page, absolute URLs and site-absolute paths unchanged)."""
    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        return m.group(0) if ABSOLUTE.match(target) else m.group(1) + base + target
    return LINK.sub(fix, text)


class ReadmeHook(MetadataHookInterface):
    PLUGIN_NAME = "custom"

    def update(self, metadata: dict) -> None:
        text = (Path(self.root) / "README.md").read_text(encoding="utf-8")
        metadata["readme"] = {"content-type": "text/markdown", "text": absolute_links(text)}
