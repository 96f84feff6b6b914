"""The call model: what a call is, whichever front door it came in through.

Call and leg records and the application's ``CallHandler`` protocol (``call``, ``handler``),
speaker roles (``roles``), the call metadata record and its limits (``metadata``), the
per-call ``Profile`` and the admins' routes file (``profile``, ``routing``) and the join of
two incoming calls into one (``join``). Sans-IO and protocol-neutral: a front door (``sip``
today; AudioSocket, an audio fork or a WebSocket stream next) parses its own wire format and
builds these records; the call model imports no front door, and no door imports another.
"""
