"""The one error family of ``asr-model``: something the user must fix, said in one line."""

from __future__ import annotations


class ModelStoreError(Exception):
    """A download, archive or model directory that cannot be used; the CLI prints it as one
    line and exits with status 2."""
