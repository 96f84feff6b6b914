"""The agent-assist console: live call views, an API for dashboards, and the admin config editor.

A separate process (``asr-gateway console`` / ``asr-console``) that reads events from Redis
only and writes the gateways' routing, KB and tag files only through its admin API.
See docs/console.md.
"""
