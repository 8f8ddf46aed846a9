"""The conventional flavour of each pipeline: what a node does without bootseer (podman
pull, pip install, one sequential stream per checkpoint file), the fallback of the bootseer
flavour and the baseline it is measured against."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bootseer.run import baseline
from bootseer.run.pipeline import Pipeline, Prepared


class PullImage(Pipeline):
    """``podman pull`` of every layer, unpack, mount (what a container engine does)."""
    kind, mode = "pull", "baseline"

    def __init__(self, ref: str, state: Path):
        self._cancel = baseline.Cancel()
        self.image = baseline.PulledImage(ref, _short_state("bsp"), self._cancel)

    def cancel(self) -> None:
        self._cancel.cancel()

    def prepare(self, timeline) -> Prepared:
        return Prepared(path=self.image.pull(), attrs={"image": self.image.ref},
                        image_config=self.image.config())

    def close(self) -> None:
        self.image.close()


class PipInstall(Pipeline):
    """``python -m venv`` + ``pip install -r SPEC`` on every node, every start."""
    kind, mode = "install", "baseline"

    def __init__(self, spec: str, prefix: str, python: str | None, index_urls: list[str]):
        self.spec, self.prefix, self.python, self.index_urls = spec, prefix, python, index_urls
        self._cancel = baseline.Cancel()

    def cancel(self) -> None:
        self._cancel.cancel()

    def prepare(self, timeline) -> Prepared:
        baseline.pip_install(self.spec, self.prefix, python=self.python,
                             index_urls=self.index_urls, cancel=self._cancel)
        return Prepared(path=self.prefix, target=self.prefix, env_var="BOOTSEER_ENV_PREFIX")


class SingleStreamCheckpoint(Pipeline):
    """Every checkpoint file read as one sequential stream into a local directory."""
    kind, mode = "fetch", "baseline"

    def __init__(self, url: str, state: Path, target: str):
        self.url, self.dir, self.target = url, state / "local", target
        self._cancel = baseline.Cancel()

    def cancel(self) -> None:
        self._cancel.cancel()

    def prepare(self, timeline) -> Prepared:
        self.dir.mkdir(parents=True, exist_ok=True)
        n = baseline.single_stream_copy(self.url, str(self.dir), cancel=self._cancel)
        return Prepared(path=str(self.dir), target=self.target, env_var="BOOTSEER_CKPT_DIR",
                        attrs={"bytes": n})

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _short_state(prefix: str) -> str:
    # podman refuses a --runroot longer than ~50 characters: keep its state under /tmp.
    return tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp")
