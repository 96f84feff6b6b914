"""Asterisk AudioSocket front door: one TCP connection is one call leg, keyed by its UUID.

``frames`` is the wire format (sans-IO framer and parser), ``session`` one connection's state
machine (sans-IO: frames in, events out), ``server`` the asyncio TCP transport that turns a
session's events into ``calls`` records and 16 kHz PCM for the application, and ``config`` its
settings. Imports the call model and rtp's resampler; never ``sip`` or another door.
"""
