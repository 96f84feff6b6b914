"""The catalogue of published models (``catalogue.yaml`` beside this module), validated.

Each entry names a WeNet checkpoint archive and the facts a site needs before fetching it:
language, training data and its licence (a WeNet model follows its data's licence),
architecture, size and, where the publisher gives one, a SHA-256 checksum.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from asr_common.yamlconf import ConfigError, load_yaml_model
from deploy.models.errors import ModelStoreError

CATALOGUE_FILE = Path(__file__).resolve().parent / "catalogue.yaml"


class CatalogueEntry(BaseModel):
    """One published model archive."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    language: str
    data: str  # what it was trained on, with hours
    data_licence: str
    architecture: str
    urls: tuple[str, ...] = Field(min_length=1)  # mirrors, tried in order
    size_mb: int | None = Field(None, gt=0)  # as the mirror lists it (approximate); None: not published
    sha256: str = ""  # "": not published (then only the archive's own integrity is checked)
    notes: str = ""

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        if value and (len(value) != 64 or any(c not in "0123456789abcdef" for c in value)):
            raise ValueError("sha256 must be 64 lower-case hex digits, or empty when not published")
        return value

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith(("https://", "http://")):
                raise ValueError(f"{url}: only http(s) URLs can be pulled")
        return value


class Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[CatalogueEntry, ...]

    def get(self, name: str) -> CatalogueEntry:
        for entry in self.models:
            if entry.name == name:
                return entry
        known = ", ".join(entry.name for entry in self.models)
        raise ModelStoreError(f"no model {name!r} in the catalogue; known: {known} (asr-model list)")


def load_catalogue(path: Path = CATALOGUE_FILE) -> Catalogue:
    """The catalogue at ``path``; a broken file is a ``ModelStoreError`` naming file:line."""
    try:
        catalogue = load_yaml_model(path, Catalogue)
    except ConfigError as exc:
        raise ModelStoreError("; ".join(exc.errors)) from None
    names = [entry.name for entry in catalogue.models]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ModelStoreError(f"{path}: model names must be unique; repeated: {', '.join(duplicates)}")
    return catalogue
