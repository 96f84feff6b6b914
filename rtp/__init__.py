"""RTP media for each call leg: packet parsing, reorder and loss handling, G.711 decode
and 8 kHz -> 16 kHz resampling into PCM pieces for the engine.

Knows nothing about SIP dialogs or the model.
"""
