"""Speech recognition core: the WeNet U2++ compatible model, the fbank front end, CTC
decoding, endpointing and the shared batched streaming ``Engine`` with its per-call ``Stream``.

Knows nothing about SIP or Redis.
"""
