"""SIP signaling for forked calls, one front door of the call model (``calls``): sans-IO
message parsing, transactions, dialogs, SDP offer/answer, SIPREC metadata and admission
control; it builds the call model's records (``CallInfo``, ``CallMetadata``, routing facts)
from SIP requests.

Owns no audio and no tensors; the asyncio transports live apart from the protocol code.
"""
