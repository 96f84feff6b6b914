"""RTP media for each call leg: packet parsing, reorder and loss handling, decoding with the
codecs of one table (`rtp.codecs`: G.711, G.722, L16, telephone-event) and 8 kHz -> 16 kHz
resampling into PCM pieces for the engine.

Knows nothing about SIP dialogs or the model.
"""
