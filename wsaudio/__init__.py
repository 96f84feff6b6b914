"""The WebSocket front door: applications (WeNet's runtime protocol, or ours) and FreeSWITCH
``mod_audio_fork`` stream a call's audio over one WebSocket connection.

``protocol`` is sans-IO (which dialect a handshake asks for, the text messages of each, the
replies, splitting stereo L16, tokens), ``lifecycle`` the connection's states as a sans-IO
transition table, ``server`` the asyncio transport on wsproto (the door's tokens, admission
through ``calls.admit``, bounded replies), ``config`` its settings. Imports the call model
and rtp's resampler; never ``sip`` or another door.
"""
