"""Where models are installed, and the two ways in: ``pull`` (catalogue -> download) and
``install`` (an archive or directory carried in by hand). Both end in ``layout.install_tree``:
the released layout, loaded once by the project's loader before it is renamed into place.

The models directory is ``$ASR_MODEL_HOME`` when set, else ``models/`` under the service's
state directory (``asr_gateway.state_dir``: ``$STATE_DIRECTORY`` under systemd,
``/var/lib/hotline-asr`` when writable, else ``~/.local/state/hotline-asr``), so a model
pulled by hand lands where a packaged service can read it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO
from urllib.parse import unquote, urlparse

from asr_core.model.errors import ModelLoadError
from asr_core.model.loader import load_wenet_model
from asr_gateway.state_dir import default_state_dir
from deploy.models.catalogue import CatalogueEntry
from deploy.models.download import DEFAULT_DOWNLOAD_LIMITS, DownloadLimits, download
from deploy.models.errors import ModelStoreError
from deploy.models.layout import find_model, install_tree
from deploy.models.unpack import DEFAULT_UNPACK_LIMITS, UnpackLimits, unpack

MODEL_HOME_ENV = "ASR_MODEL_HOME"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
DOWNLOADS = ".downloads"
"""Sub-directory of the models directory holding transfers in progress (``*.part``)."""


def default_model_home(environ: Mapping[str, str]) -> Path:
    home = environ.get(MODEL_HOME_ENV)
    return Path(home) if home else default_state_dir(environ) / "models"


def pull(
    entry: CatalogueEntry, home: Path, *, replace: bool, progress: TextIO,
    download_limits: DownloadLimits = DEFAULT_DOWNLOAD_LIMITS, unpack_limits: UnpackLimits = DEFAULT_UNPACK_LIMITS,
) -> Path:  # fmt: skip
    """Fetch ``entry``'s archive (resuming a partial one), unpack and install it as
    ``home/<entry.name>``; the archive is removed once installed or refused."""
    dest = home / entry.name
    if dest.exists() and not replace:
        raise ModelStoreError(f"{dest} already exists; pass --force to replace it")
    downloads = home / DOWNLOADS
    downloads.mkdir(parents=True, exist_ok=True)
    archive = downloads / _archive_name(entry.urls[0])
    if not archive.exists():
        download(entry.urls, archive, sha256=entry.sha256, limits=download_limits, progress=progress)
    try:
        return install_archive(archive, dest, replace=replace, limits=unpack_limits)
    finally:
        archive.unlink()  # installed, or refused: a refused archive would be refused again


def install(
    source: Path, home: Path, name: str | None, *, replace: bool, limits: UnpackLimits = DEFAULT_UNPACK_LIMITS
) -> Path:
    """Install an archive file or a model directory as ``home/<name>`` (default: its own name
    without the archive suffix)."""
    if not source.exists():
        raise ModelStoreError(f"{source}: no such file or directory")
    dest = home / _checked_name(name or _stem(source))
    if source.is_dir():
        return install_tree(find_model(source), dest, replace=replace, move=False, verify=_loads)
    return install_archive(source, dest, replace=replace, limits=limits)


def install_archive(archive: Path, dest: Path, *, replace: bool, limits: UnpackLimits = DEFAULT_UNPACK_LIMITS) -> Path:
    if dest.exists() and not replace:
        raise ModelStoreError(f"{dest} already exists; pass --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = dest.with_name(f".{dest.name}.unpack-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        unpack(archive, scratch, limits)
        return install_tree(find_model(scratch), dest, replace=replace, move=True, verify=_loads)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _loads(model_dir: Path) -> None:
    try:
        load_wenet_model(model_dir)
    except ModelLoadError as exc:
        raise ModelStoreError(f"the unpacked model does not load: {exc}") from None


def _archive_name(url: str) -> str:
    name = Path(unquote(urlparse(url).path)).name
    if not name.endswith(ARCHIVE_SUFFIXES):
        raise ModelStoreError(f"{url}: not an archive URL (expected one of {', '.join(ARCHIVE_SUFFIXES)})")
    return name


def _checked_name(name: str) -> str:
    """A model's directory name: one path component, not hidden (ours start with a dot)."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ModelStoreError(f"--name {name!r}: use a plain directory name (no '/', not starting with '.')")
    return name


def _stem(path: Path) -> str:
    name = path.resolve().name
    for suffix in ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
