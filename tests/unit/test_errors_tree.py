"""Every exception class of bootseer descends from BootseerError and is listed in the tree
that errors.py's docstring draws: a caller catches bootseer's errors with one class, and
a reader finds each one from the root."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import bootseer
from bootseer import errors

OPTIONAL = ("grpc", "google.protobuf", "libtorrent", "torch", "zstandard", "fsspec", "mfusepy")
"""Extras a module may need: one that is not installed leaves that module unchecked."""
SCRIPTS = ("bootseer.demo.train",)
"""Programs shipped into a job's image, not imported by bootseer (torch at import)."""


def _exception_classes() -> list[tuple[str, type]]:
    found = []
    for info in pkgutil.walk_packages(bootseer.__path__, "bootseer."):
        if info.name in SCRIPTS or info.name.endswith(".__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError as e:
            if (e.name or "").startswith(OPTIONAL):
                continue
            raise
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) \
                    and obj.__module__ == module.__name__:
                found.append((module.__name__.removeprefix("bootseer."), obj))
    return found


CLASSES = _exception_classes()


def test_the_walk_finds_the_classes_outside_errors_py():
    assert len([c for m, c in CLASSES if m != "errors"]) >= 20


@pytest.mark.parametrize("module,cls", CLASSES, ids=[f"{m}.{c.__name__}" for m, c in CLASSES])
def test_exception_descends_from_bootseer_error_and_is_listed(module, cls):
    assert issubclass(cls, errors.BootseerError), \
        f"{module}.{cls.__name__} does not descend from bootseer.errors.BootseerError"
    listed = cls.__name__ if module == "errors" else f"{module}.{cls.__name__}"
    assert re.search(rf"[─ ]{re.escape(listed)}\b", errors.__doc__), \
        f"{listed} is not in the tree drawn by errors.py's docstring"
