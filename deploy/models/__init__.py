"""Model management beside the service (``asr-model``): a catalogue of published WeNet
checkpoints, fetching one (resumable, checksummed), unpacking an archive safely, installing it
in WeNet's released layout, and checking that a directory will stream.

The only code of the project that reaches a network, and only in ``pull``; the serving
packages never import it. ``install`` does the same from an archive or directory carried in
by hand, the normal path on an offline hotline.
"""
