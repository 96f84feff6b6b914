"""Only the optional C extension is declared here; everything else is in setup.cfg.

`rtp._fastrtp` (the RTP receive fast path) is optional: where it cannot be compiled (no C
compiler or Python headers) the install goes on and the pure Python receive path runs.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("rtp._fastrtp", ["rtp/_fastrtp.c"], optional=True, extra_compile_args=["-O2"])])
