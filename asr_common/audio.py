"""The two audio rates of the service, in Hz, defined once.

Calls arrive as G.711 at ``TELEPHONE_RATE``; ``rtp`` upsamples them to ``SAMPLE_RATE``, the
rate of the fbank front end and of every WeNet model the engine serves. One sample at
``SAMPLE_RATE`` is 1/16 ms, so a 10 ms fbank shift is 160 samples.
"""

SAMPLE_RATE = 16_000
"""Hz: the engine's input, the fbank's ``sample_frequency`` (WeNet's models are trained at it)."""

TELEPHONE_RATE = 8_000
"""Hz: narrowband telephone audio (G.711 PCMU/PCMA), as calls and 8 kHz recordings deliver it."""
