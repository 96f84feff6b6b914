"""Errors raised while reading a WeNet model directory."""


class ModelLoadError(Exception):
    """The model directory cannot be used: a file is missing or malformed, or the checkpoint
    does not fit the configuration. The message names the file and what to do."""


class ModelConfigError(ModelLoadError):
    """``train.yaml`` asks for an option this implementation does not support, or is invalid.
    The message names the option (with its line in the file when known) and the allowed values."""
