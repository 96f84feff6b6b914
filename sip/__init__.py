"""SIP signaling for forked calls: sans-IO message parsing, transactions, dialogs,
SDP offer/answer, SIPREC metadata, routing of a call to a profile and admission control.

Owns no audio and no tensors; the asyncio transports live apart from the protocol code.
"""
