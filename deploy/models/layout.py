"""WeNet's released layout, and installing a model in it.

A released WeNet model directory holds ``train.yaml``, ``final.pt``, ``units.txt`` and
``global_cmvn`` (what ``asr_core.model.loader`` reads). Archives vary around that: the files
sit under one top folder (``20210601_u2++_conformer_exp/``), the units are called
``words.txt`` or ``lang_char.txt``, the CMVN file keeps the name train.yaml gives it. A
runtime export (``final.zip``, TorchScript) is no checkpoint: it is refused with what to fetch
instead (``asr_core`` runs its own batched step over the checkpoint's weights).

``install_tree`` copies the four files under their released names into a staging directory
beside the destination, loads the result with the project's loader, and only then renames it
into place, so a model directory either loads or is not there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from asr_core.model.loader import CMVN_FILE, MODEL_FILES
from deploy.models.errors import ModelStoreError

UNITS_FILE = "units.txt"
UNITS_ALIASES = (UNITS_FILE, "words.txt", "lang_char.txt", "tokens.txt", "dict.txt")
"""Names WeNet's recipes and releases give the symbol table, in order of preference."""
RUNTIME_EXPORT = "final.zip"
RUNTIME_ADVICE = (
    "a TorchScript runtime export (final.zip) cannot be served: the engine runs its own batched, "
    "cached chunk step over a checkpoint's weights, which final.zip hides in a frozen graph (often "
    "int8-quantized). Fetch the checkpoint archive of the same model instead (final.pt + train.yaml: "
    "WeNet's '*_exp.tar.gz', not '*_libtorch.tar.gz'; asr-model list)"
)


@dataclass(frozen=True, slots=True)
class Found:
    """Where each released file was found under an unpacked archive or a directory."""

    model_dir: Path
    files: dict[str, Path]  # released name -> source path
    renamed: dict[str, str]  # released name -> the name it had, when it differed


def find_model(root: Path) -> Found:
    """The one directory under ``root`` (itself included) holding ``train.yaml``, and its files."""
    candidates = sorted({path.parent for path in root.rglob("train.yaml") if path.is_file()})
    if not candidates:
        if any(root.rglob(RUNTIME_EXPORT)):
            raise ModelStoreError(f"{root}: {RUNTIME_ADVICE}")
        raise ModelStoreError(
            f"{root}: no train.yaml found; a WeNet checkpoint holds train.yaml, final.pt, units.txt and global_cmvn"
        )
    if len(candidates) > 1:
        listed = ", ".join(str(path.relative_to(root)) for path in candidates)
        raise ModelStoreError(f"{root}: several model directories ({listed}); install one of them")
    model_dir = candidates[0]
    files: dict[str, Path] = {"train.yaml": model_dir / "train.yaml"}
    renamed: dict[str, str] = {}
    checkpoint = _checkpoint(model_dir)
    files["final.pt"] = checkpoint
    if checkpoint.name != "final.pt":
        renamed["final.pt"] = checkpoint.name
    units = next((model_dir / name for name in UNITS_ALIASES if (model_dir / name).is_file()), None)
    if units is None:
        raise ModelStoreError(f"{model_dir}: no symbol table (looked for {', '.join(UNITS_ALIASES)})")
    files[UNITS_FILE] = units
    if units.name != UNITS_FILE:
        renamed[UNITS_FILE] = units.name
    cmvn = _cmvn(model_dir)
    if cmvn is not None:
        files[CMVN_FILE] = cmvn
        if cmvn.name != CMVN_FILE:
            renamed[CMVN_FILE] = cmvn.name
    return Found(model_dir, files, renamed)


def _checkpoint(model_dir: Path) -> Path:
    """``final.pt``, else the only ``*.pt`` there (an averaged ``avg_10.pt``)."""
    if (model_dir / "final.pt").is_file():
        return model_dir / "final.pt"
    others = sorted(path for path in model_dir.glob("*.pt") if path.is_file())
    if len(others) == 1:
        return others[0]
    if (model_dir / RUNTIME_EXPORT).is_file():
        raise ModelStoreError(f"{model_dir}: {RUNTIME_ADVICE}")
    if not others:
        raise ModelStoreError(f"{model_dir}: no checkpoint (final.pt) beside train.yaml")
    names = ", ".join(path.name for path in others)
    raise ModelStoreError(f"{model_dir}: no final.pt and several checkpoints ({names}); keep the one to serve")


def _cmvn(model_dir: Path) -> Path | None:
    """``global_cmvn``, else the file train.yaml's ``cmvn_conf.cmvn_file`` names, by its base name."""
    if (model_dir / CMVN_FILE).is_file():
        return model_dir / CMVN_FILE
    try:
        config = yaml.safe_load((model_dir / "train.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the loader reports a broken train.yaml with its line
    named = ((config or {}).get("cmvn_conf") or {}).get("cmvn_file") if isinstance(config, dict) else None
    if isinstance(named, str) and (model_dir / Path(named).name).is_file():
        return model_dir / Path(named).name
    return None


def install_tree(found: Found, dest: Path, *, replace: bool, move: bool, verify: Callable[[Path], object]) -> Path:
    """Put ``found``'s files under their released names in ``dest``; ``verify`` (the loader)
    must accept the staged directory first. ``move``: rename the sources (an unpacked archive
    of ours) instead of copying them (a directory carried in, perhaps read-only)."""
    if dest.exists() and not replace:
        raise ModelStoreError(f"{dest} already exists; pass --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".{dest.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for name, source in found.files.items():
            if move:
                os.replace(source, staging / name)
            else:
                shutil.copyfile(source, staging / name)
            (staging / name).chmod(0o644)
        missing = [name for name in MODEL_FILES if not (staging / name).is_file()]
        if missing:
            raise ModelStoreError(f"{found.model_dir}: missing {', '.join(missing)}")
        verify(staging)
        if dest.exists():
            retired = dest.with_name(f".{dest.name}.replaced-{os.getpid()}")
            dest.rename(retired)
            staging.rename(dest)
            shutil.rmtree(retired)
        else:
            staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
