"""Pooled, windowed attention and convolution caches for streaming encoders.

A fixed pool of slots (one per stream), ring writes of each new chunk, batched gathers
with validity masks, memory accounting. Knows nothing about audio or text.
"""
