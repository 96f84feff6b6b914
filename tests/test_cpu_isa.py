"""cpu_isa: flags parsed from /proc/cpuinfo text, capped like oneDNN, mapped to INT8 modes."""

from pathlib import Path

import pytest

from asr_core.cpu_isa import detect, from_flags, parse_flags

ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
ICELAKE = "flags\t\t: avx2 avx512f avx512bw avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8 amx_tile\n"


@pytest.mark.parametrize(
    ("cpuinfo", "level"),
    [
        (ZEN3, "avx2"),
        (ICELAKE, "avx512_vnni"),
        (SAPPHIRE_RAPIDS, "amx"),
        ("flags : avx2 avx_vnni\n", "avx2_vnni"),
        ("", "baseline"),
    ],
)
def test_level_names_the_highest_tier(cpuinfo: str, level: str) -> None:
    assert from_flags(parse_flags(cpuinfo)).level == level


def test_onednn_cap_masks_the_extensions_above_it() -> None:
    capped = from_flags(parse_flags(SAPPHIRE_RAPIDS), "AVX2")
    assert capped.level == "avx2" and not capped.vnni and capped.capped_by == "AVX2"
    assert from_flags(parse_flags(SAPPHIRE_RAPIDS), "avx512_core_vnni").level == "avx512_vnni"
    assert from_flags(parse_flags(ZEN3), "ALL").level == "avx2"


def test_detect_reads_the_file_and_the_environment(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ICELAKE)
    assert detect(cpuinfo, env={}).level == "avx512_vnni"
    assert detect(cpuinfo, env={"ONEDNN_MAX_CPU_ISA": "AVX2"}).level == "avx2"
    assert detect(tmp_path / "missing", env={}).level == "baseline"


def test_int8_mode_is_full_range_only_with_vnni() -> None:
    onnx_graph = pytest.importorskip("asr_core.backends.onnx_graph")
    assert onnx_graph.int8_mode_for(from_flags(parse_flags(ZEN3))) == "u8s8-reduce-range"
    assert onnx_graph.int8_mode_for(from_flags(parse_flags(ICELAKE))) == "u8s8"
    assert onnx_graph.int8_file("u8s8") == onnx_graph.ENCODER_INT8_FILE
    assert onnx_graph.int8_file("u8s8-reduce-range") == "encoder_chunk.int8-u8s8-reduce-range.onnx"


@pytest.mark.parametrize(("cpuinfo", "engine"), [(ZEN3, "x86"), (ICELAKE, "x86"), (SAPPHIRE_RAPIDS, "onednn")])
def test_int8_linears_use_onednn_only_with_amx(cpuinfo: str, engine: str) -> None:
    from asr_core.backends import int8_engine

    assert int8_engine(from_flags(parse_flags(cpuinfo))) == engine
    assert int8_engine(from_flags(parse_flags(SAPPHIRE_RAPIDS), "AVX512_CORE_VNNI")) == "x86"
