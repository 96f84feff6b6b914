"""Which x86-64 SIMD extensions this CPU offers, for choosing numerics that are accurate on it.

INT8 matrix kernels differ by ISA, and so does their accuracy: without VNNI (AVX2 and plain
AVX-512) ONNX Runtime's u8 x s8 kernels add pairs of products in saturating int16
(``vpmaddubsw``), so full-range int8 weights can clip; with VNNI (AVX512-VNNI, AVX-VNNI, AMX)
the products accumulate in int32 and nothing clips. Code that quantizes asks `detect()` and
picks the mode that is exact enough on the CPU at hand.

``ONEDNN_MAX_CPU_ISA`` caps what `detect()` reports the way it caps oneDNN (e.g. ``AVX2``),
so that an AVX-512 machine can run the choices an AVX2-only one would make (CI does).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

# ONEDNN_MAX_CPU_ISA values -> the extensions they leave on.
_CAPS: dict[str, frozenset[str]] = {
    "SSE41": frozenset(),
    "AVX": frozenset(),
    "AVX2": frozenset({"avx2"}),
    "AVX2_VNNI": frozenset({"avx2", "vnni"}),
    "AVX2_VNNI_2": frozenset({"avx2", "vnni"}),
    "AVX512_CORE": frozenset({"avx2", "avx512"}),
    "AVX512_CORE_VNNI": frozenset({"avx2", "avx512", "vnni"}),
    "AVX512_CORE_BF16": frozenset({"avx2", "avx512", "vnni", "bf16"}),
    "AVX10_1_512": frozenset({"avx2", "avx512", "vnni", "bf16"}),
    "AVX512_CORE_FP16": frozenset({"avx2", "avx512", "vnni", "bf16"}),
    "AVX512_CORE_AMX": frozenset({"avx2", "avx512", "vnni", "bf16", "amx"}),
    "AVX512_CORE_AMX_FP16": frozenset({"avx2", "avx512", "vnni", "bf16", "amx"}),
    "AVX10_2_512": frozenset({"avx2", "avx512", "vnni", "bf16", "amx"}),
    "AVX10_2_512_AMX_2": frozenset({"avx2", "avx512", "vnni", "bf16", "amx"}),
}


@dataclass(frozen=True)
class CpuIsa:
    """The SIMD extensions that matter for this service's numerics."""

    avx2: bool = False
    avx512: bool = False  # avx512f
    vnni: bool = False  # int8 dot products into int32: avx512_vnni or avx_vnni
    bf16: bool = False  # avx512_bf16
    amx: bool = False  # amx_int8 / amx_bf16 tiles
    capped_by: str | None = None  # the ONEDNN_MAX_CPU_ISA value that masked the rest

    @property
    def level(self) -> str:
        """The highest tier, as deploy/README.md's CPU table names them."""
        for name, present in (
            ("amx", self.amx),
            ("avx512_bf16", self.bf16 and self.avx512),
            ("avx512_vnni", self.vnni and self.avx512),
            ("avx2_vnni", self.vnni),
            ("avx512", self.avx512),
            ("avx2", self.avx2),
        ):
            if present:
                return name
        return "baseline"


def parse_flags(cpuinfo_text: str) -> frozenset[str]:
    """The first processor's ``flags`` from /proc/cpuinfo text (empty when there are none)."""
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def from_flags(flags: frozenset[str], cap: str | None = None) -> CpuIsa:
    """`CpuIsa` from cpuinfo flags, masked by a ONEDNN_MAX_CPU_ISA value (unknown ones are ignored)."""
    isa = CpuIsa(
        avx2="avx2" in flags,
        avx512="avx512f" in flags,
        vnni="avx512_vnni" in flags or "avx_vnni" in flags,
        bf16="avx512_bf16" in flags,
        amx="amx_int8" in flags or "amx_bf16" in flags,
    )
    allowed = _CAPS.get((cap or "").upper())
    if allowed is None:
        return isa
    return replace(
        isa,
        avx2=isa.avx2 and "avx2" in allowed,
        avx512=isa.avx512 and "avx512" in allowed,
        vnni=isa.vnni and "vnni" in allowed,
        bf16=isa.bf16 and "bf16" in allowed,
        amx=isa.amx and "amx" in allowed,
        capped_by=cap,
    )


def detect(cpuinfo: Path = CPUINFO, env: Mapping[str, str] | None = None) -> CpuIsa:
    """This CPU's `CpuIsa` (all False where /proc/cpuinfo is unreadable, e.g. not Linux)."""
    try:
        flags = parse_flags(cpuinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        flags = frozenset()
    return from_flags(flags, (os.environ if env is None else env).get("ONEDNN_MAX_CPU_ISA"))
