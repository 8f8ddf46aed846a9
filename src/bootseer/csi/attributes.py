"""What a pod may ask of the node plugin, checked before anything is fetched or mounted.

A pod's author writes the volume's attributes and, through the pod, chooses nothing else
the plugin sees; the kubelet writes the target path and the volume id. The plugin runs as
root, so every one of them is refused unless it is exactly what an inline volume needs:

- ``environment``: an environment key (``sha256:`` and 64 hex digits, from ``bootseer deps
  key``), published in the node's store; or ``checkpoint``: the URL of a checkpoint
  directory on a remote store (http, https, s3, gs, hdfs, webhdfs; never ``file://`` or a
  path: a pod must not read the node's own files through the plugin), and when the
  administrator lists allowed URL prefixes, under one of them. Exactly one of the two.
- the kubelet's own attributes (``csi.storage.k8s.io/...``: the pod's name, namespace, uid,
  service account, ``ephemeral``), and nothing else: an unknown key is a typo or a probe,
  refused, never ignored.
- the target path: absolute, already normal (no ``..``, no ``//``, no trailing ``/``), no
  ``,`` or ``:`` (mount options cannot quote them), under ``<kubelet dir>/pods/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from bootseer import redact
from bootseer.errors import UsageError

ENVIRONMENT = "environment"
CHECKPOINT = "checkpoint"
KUBELET_PREFIX = "csi.storage.k8s.io/"
KUBELET_KEYS = frozenset(f"{KUBELET_PREFIX}{k}" for k in (
    "pod.name", "pod.namespace", "pod.uid", "serviceAccount.name", "ephemeral",
    "serviceAccount.tokens"))
CHECKPOINT_SCHEMES = ("http://", "https://", "s3://", "gs://", "gcs://", "hdfs://",
                      "webhdfs://")
_KEY = re.compile(r"sha256:[0-9a-f]{64}")
_VOLUME_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_URL = 2048   # a URL longer than this is not a checkpoint's address


class VolumeAttributeError(UsageError):
    """A volume's attributes, id or target path that the plugin refuses (the gRPC status
    INVALID_ARGUMENT); the message is one line naming the attribute."""


@dataclass(frozen=True)
class EnvironmentVolume:
    key: str

    def describe(self) -> str:
        return f"environment {self.key[:19]}"


@dataclass(frozen=True)
class CheckpointVolume:
    url: str

    def describe(self) -> str:
        return f"checkpoint {redact.url(self.url)}"


Source = EnvironmentVolume | CheckpointVolume


@dataclass(frozen=True)
class Volume:
    """One inline volume as the kubelet asks for it: its id, where it goes, what it holds,
    and the pod it is for (``pod``: namespace/name, for log lines only)."""

    volume_id: str
    target_path: str
    source: Source
    pod: str = ""


def check_volume_id(volume_id: str) -> str:
    if not _VOLUME_ID.fullmatch(volume_id or ""):
        raise VolumeAttributeError(f"volume id {volume_id[:64]!r} is not 1-128 letters, "
                                   f"digits, '.', '_' or '-'")
    return volume_id


def check_target(target_path: str, kubelet_dir: str) -> str:
    """The target path, refused unless it is a normal absolute path under the kubelet's
    pods directory (the only place the kubelet publishes a pod's volumes)."""
    pods = os.path.join(os.path.normpath(kubelet_dir), "pods") + "/"
    shown = target_path[:200]
    if not target_path or not os.path.isabs(target_path):
        raise VolumeAttributeError(f"target path {shown!r} is not absolute")
    if os.path.normpath(target_path) != target_path or "\0" in target_path:
        raise VolumeAttributeError(f"target path {shown!r} is not a normal path ('..', "
                                   f"'//' or a trailing '/')")
    if not target_path.startswith(pods) or target_path == pods.rstrip("/"):
        raise VolumeAttributeError(f"target path {shown!r} is not under {pods}; hint: "
                                   f"--kubelet-dir names the kubelet's root directory")
    if "," in target_path or ":" in target_path:
        raise VolumeAttributeError(f"target path {shown!r} has a ',' or ':', which mount "
                                   f"options cannot quote")
    return target_path


def check_url(url: str, allowed_prefixes: tuple[str, ...] = ()) -> str:
    if len(url) > _MAX_URL or any(c in url for c in "\0\n\r\t "):
        raise VolumeAttributeError(f"attribute {CHECKPOINT} is not a URL")
    if not url.startswith(CHECKPOINT_SCHEMES):
        raise VolumeAttributeError(
            f"attribute {CHECKPOINT} {redact.url(url)[:120]!r} is not one of "
            f"{', '.join(s.rstrip('/') for s in CHECKPOINT_SCHEMES)} (a node's local files "
            f"are not a pod's to read)")
    if any(part == ".." for part in url.split("?", 1)[0].split("/")):
        raise VolumeAttributeError(f"attribute {CHECKPOINT} {redact.url(url)[:120]!r} has a "
                                   f"'..' segment")
    if allowed_prefixes and not any(url.startswith(p) for p in allowed_prefixes):
        raise VolumeAttributeError(
            f"attribute {CHECKPOINT} {redact.url(url)[:120]!r} is under none of the URL "
            f"prefixes this node allows; hint: the plugin's --allow-checkpoint flags")
    return url


def parse(volume_id: str, target_path: str, context: Mapping[str, str], *,
          kubelet_dir: str, allowed_prefixes: tuple[str, ...] = ()) -> Volume:
    """The volume the kubelet asks to publish, or VolumeAttributeError (one line)."""
    check_volume_id(volume_id)
    check_target(target_path, kubelet_dir)
    unknown = sorted(k for k in context
                     if k not in (ENVIRONMENT, CHECKPOINT) and k not in KUBELET_KEYS)
    if unknown:
        raise VolumeAttributeError(
            f"unknown volume attribute {unknown[0][:64]!r}; hint: a bootseer volume takes "
            f"'{ENVIRONMENT}' (an environment key) or '{CHECKPOINT}' (a checkpoint URL)")
    if context.get(f"{KUBELET_PREFIX}ephemeral", "true") != "true":
        raise VolumeAttributeError("only inline ephemeral volumes are served (csi: in the "
                                   "pod's volumes, not a PersistentVolume)")
    given = [k for k in (ENVIRONMENT, CHECKPOINT) if k in context]
    if len(given) != 1:
        raise VolumeAttributeError(f"give exactly one of the attributes '{ENVIRONMENT}' and "
                                   f"'{CHECKPOINT}' ({len(given)} given)")
    source: Source
    if given[0] == ENVIRONMENT:
        key = context[ENVIRONMENT]
        if not _KEY.fullmatch(key):
            raise VolumeAttributeError(f"attribute {ENVIRONMENT} {key[:80]!r} is not an "
                                       f"environment key (sha256: and 64 hex digits); hint: "
                                       f"bootseer deps key SPEC --prefix PATH prints it")
        source = EnvironmentVolume(key)
    else:
        source = CheckpointVolume(check_url(context[CHECKPOINT], allowed_prefixes))
    pod = "/".join(context.get(f"{KUBELET_PREFIX}{k}", "")
                   for k in ("pod.namespace", "pod.name")).strip("/")
    return Volume(volume_id, target_path, source, pod)
