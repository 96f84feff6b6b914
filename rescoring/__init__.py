"""Attention rescoring of CTC n-best lists with the bidirectional (L2R + R2L) decoder,
batched across hypotheses and streams. Holds no stream state.
"""
