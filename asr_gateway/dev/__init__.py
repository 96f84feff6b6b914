"""Development harnesses: the demo, the loopback cluster, sipp callers and throwaway Redis servers.

They start real peers (redis-server, sipp, Kamailio) for the demo, the benchmarks and the tests.
The serving modules of ``asr_gateway`` never import this package (an import-linter contract in
``setup.cfg``); only the command line reaches it, for ``asr-gateway demo`` and ``cluster``.
"""
