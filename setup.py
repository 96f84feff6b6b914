"""Only the optional C extensions are declared here; everything else is in setup.cfg.

Both are optional: where they cannot be compiled (no C compiler or Python headers) the install
goes on and the pure Python paths run.

- `rtp._fastrtp`: the RTP receive fast path.
- `asr_core._fastctc`: the finals' CTC prefix beam search. It must round exactly as the numpy
  search does, so no contraction of multiply-adds into FMAs.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("rtp._fastrtp", ["rtp/_fastrtp.c"], optional=True, extra_compile_args=["-O2"]),
        Extension(
            "asr_core._fastctc", ["asr_core/_fastctc.c"], optional=True, extra_compile_args=["-O2", "-ffp-contract=off"]
        ),
    ]
)
