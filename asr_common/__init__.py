"""What several layers share, below all of them: YAML config files with ``file:line`` errors
(``yamlconf``), rings of recent measurements (``latency``), the audio rates and the PCM sink (``audio``), the
capacity-error family (``errors``), character error rates (``scoring``), the stop-time
wait that gives up only on work that stalls (``draining``) and the memory allocator the
engine's commands run on (``allocator``).

Imports nothing of the project's other packages, so every package may import it.
"""
