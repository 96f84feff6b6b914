"""Only the C extensions are declared here; everything else is in setup.cfg.

Both are optional for an install: where they cannot be compiled (no C compiler or Python
headers) the install goes on and the pure Python paths run. With ASR_REQUIRE_C_EXTENSIONS=1
(`make test` and CI set it) they are required, so that a compile error fails the build instead
of a test run going green on the Python paths.

- `rtp._fastrtp`: the RTP receive fast path.
- `asr_core._fastctc`: the finals' CTC prefix beam search. It must round exactly as the numpy
  search does, so no contraction of multiply-adds into FMAs.
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, LinkError

REQUIRE_ENV = "ASR_REQUIRE_C_EXTENSIONS"
REQUIRED = os.environ.get(REQUIRE_ENV, "").lower() in ("1", "true", "yes")


class BuildExt(build_ext):
    """Says why a required extension failed and how to do without it."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, LinkError) as exc:
            if ext.optional:
                raise
            raise CompileError(
                f"{ext.name} did not build (the compiler's output is above); {REQUIRE_ENV}=1 requires it. "
                f"It needs gcc and the Python headers (apt-get install gcc python3-dev); without "
                f"{REQUIRE_ENV} the install goes on without it."
            ) from exc


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension("rtp._fastrtp", ["rtp/_fastrtp.c"], optional=not REQUIRED, extra_compile_args=["-O2"]),
        Extension(
            "asr_core._fastctc",
            ["asr_core/_fastctc.c"],
            optional=not REQUIRED,
            extra_compile_args=["-O2", "-ffp-contract=off"],
        ),
    ],
)
