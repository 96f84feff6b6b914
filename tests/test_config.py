"""The service config model: defaults, env overrides, file:line errors, check-config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asr_common.yamlconf import ConfigError
from asr_gateway.cli import main as gateway_main
from asr_gateway.config import ServiceConfig, load_config

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "deploy" / "config" / "example.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def errors_of(path: Path | None, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ or {})
    return info.value.errors


def test_defaults_work_without_a_file(tmp_path: Path) -> None:
    config = load_config(None, {"STATE_DIRECTORY": str(tmp_path)})
    assert config.model_dump(exclude={"redis": {"spool_dir"}}) == ServiceConfig().model_dump(
        exclude={"redis": {"spool_dir"}}
    )
    assert config.redis.spool_dir == tmp_path / "spool"  # the state directory, see tests/test_state_dir.py
    assert config.engine.chunk_ms == 160
    assert config.engine.left_chunks == 8
    assert config.engine.endpoint.trailing_silence_ms == 800
    assert config.redis.url.startswith("redis://")


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), {"STATE_DIRECTORY": str(tmp_path / "state")})
    skip = {"redis": {"spool_dir"}}
    assert config.model_dump(exclude=skip) == ServiceConfig().model_dump(exclude=skip)
    assert config.redis.spool_dir == tmp_path / "state" / "spool", "not beside the config file"


def test_example_config_is_valid() -> None:
    config = load_config(EXAMPLE, {})
    assert str(config.sip.acl_cidrs[0]) == "10.0.0.0/8"
    assert config.sip.open_settings() == [] and config.metrics.open_settings() == []
    assert [str(net) for net in config.sip.trusted_cidrs] == ["10.20.0.0/24"]


def test_env_overrides_file_values(tmp_path: Path) -> None:
    path = write(tmp_path, "redis:\n  url: redis://10.1.1.1:6379/0\nsip:\n  port: 5070\n")
    config = load_config(
        path,
        {
            "ASR_REDIS_URL": "redis://127.0.0.1:6390/2",
            "ASR_SIP_PORT": "5080",
            "ASR_SIP_TRANSPORTS": "[udp]",
            "ASR_ENGINE_ENDPOINT__TRAILING_SILENCE_MS": "600",
            "ASR_MODEL_DIR": "/not/a/section/ignored",
            "PATH": "/usr/bin",
        },
    )
    assert config.redis.url == "redis://127.0.0.1:6390/2"
    assert config.sip.port == 5080
    assert config.sip.transports == ["udp"]
    assert config.engine.endpoint.trailing_silence_ms == 600


def test_bad_env_value_names_the_variable() -> None:
    (line,) = errors_of(None, {"ASR_SIP_PORT": "many"})
    assert line.startswith("env ASR_SIP_PORT:")
    assert "integer" in line


def test_wrong_type_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "sip:\n  host: 0.0.0.0\n  port: five\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:3 sip.port: 'five' is invalid")


def test_unknown_key_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "engine:\n  max_batch: 8\n  max_btach: 16\n")
    assert errors_of(path) == [f"{path}:3 engine.max_btach: unknown key"]


def test_bad_cidr(tmp_path: Path) -> None:
    path = write(tmp_path, "sip:\n  acl_cidrs:\n    - 10.0.0.0/8\n    - 10.0.0.0/33\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:4 sip.acl_cidrs.1: '10.0.0.0/33' is invalid: ")
    assert "IPv4 network" in line and "IPv6 network" in line


def test_chunk_size_lists_allowed_values(tmp_path: Path) -> None:
    path = write(tmp_path, "engine:\n  chunk_ms: 150\n")
    assert errors_of(path) == [f"{path}:2 engine.chunk_ms: 150 is not one of 160, 240, 320, 640"]


def test_backend_auto_picks_int8_on_cpu_and_torch_on_gpu(tmp_path: Path) -> None:
    assert load_config(None, {}).engine.resolved_backend == "torch-int8"
    gpu = load_config(write(tmp_path, "engine:\n  device: cuda:0\n  dtype: float16\n"), {})
    assert gpu.engine.resolved_backend == "torch"
    chosen = load_config(write(tmp_path, "engine:\n  backend: onnxruntime-int8\n"), {})
    assert chosen.engine.resolved_backend == "onnxruntime-int8"
    path = write(tmp_path, "rtp:\n  resampler: sinc\nengine:\n  backend: int4\n")
    problems = errors_of(path)
    assert len(problems) == 2
    assert problems[0].startswith(f"{path}:2 rtp.resampler:") and "'halfband' or 'soxr'" in problems[0]
    assert problems[1].startswith(f"{path}:4 engine.backend: 'int4' is not one of auto, torch, torch-int8")


def test_schedulers_auto_is_one_per_usable_core_sharing_the_cores_as_torch_threads(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    default = load_config(None, {}).engine
    assert (default.schedulers, default.resolved_schedulers) == (0, cores)
    assert default.resolved_threads == (0 if cores == 1 else 1)
    engine = load_config(write(tmp_path, "engine:\n  schedulers: 0\n"), {}).engine
    assert engine.schedulers == 0 and engine.resolved_schedulers == cores
    assert engine.resolved_threads == (0 if cores == 1 else 1)  # cores // schedulers each; 0: torch's own
    two = load_config(write(tmp_path, "engine:\n  schedulers: 2\n  threads: 3\n"), {}).engine
    assert (two.resolved_schedulers, two.resolved_threads) == (2, 3)  # as configured
    gpu = load_config(write(tmp_path, "engine:\n  device: cuda:0\n  dtype: float16\n"), {}).engine
    assert (gpu.resolved_schedulers, gpu.resolved_threads) == (1, 0)
    assert load_config(None, {"ASR_ENGINE_SCHEDULERS": "3"}).engine.resolved_schedulers == 3
    problems = errors_of(write(tmp_path, "engine:\n  schedulers: -1\n"))
    assert len(problems) == 1 and "engine.schedulers" in problems[0]


def test_finals_workers_niceness_and_lag_limit(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    default = load_config(None, {}).engine
    assert (default.finals_workers, default.resolved_finals_workers) == (0, cores)
    assert (default.finals_niceness, default.finals_behind_ms) == (15, 4000.0)
    engine = load_config(write(tmp_path, "engine:\n  finals_workers: 1\n  finals_niceness: 0\n"), {}).engine
    assert engine.resolved_finals_workers == 1 and engine.finals_niceness == 0
    gpu = load_config(write(tmp_path, "engine:\n  device: cuda:0\n  dtype: float16\n  finals_workers: 0\n"), {})
    assert gpu.engine.resolved_finals_workers == 1
    problems = errors_of(write(tmp_path, "engine:\n  finals_niceness: 20\n  finals_workers: -1\n"))
    assert len(problems) == 2 and any("engine.finals_niceness" in p for p in problems)


def test_finals_give_way_while_the_engine_is_saturated_unless_told_not_to(tmp_path: Path) -> None:
    from asr_core.surge import SurgeSettings

    assert load_config(None, {}).engine.surge.finals_reduce_when_saturated is True
    path = write(tmp_path, "engine:\n  surge:\n    enabled: true\n    finals_reduce_when_saturated: false\n")
    assert load_config(path, {}).engine.surge.settings() == SurgeSettings(finals_reduce_when_saturated=False)
    path = write(tmp_path, "engine:\n  surge:\n    finals_reduce_when_saturated: sometimes\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:3 engine.surge.finals_reduce_when_saturated: 'sometimes' is invalid")
    assert "boolean" in line


def test_several_errors_are_all_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "rtp:\n  port_min: 30000\n  port_max: 20000\nredis:\n  stream_maxlen: 5\n")
    lines = errors_of(path)
    assert len(lines) == 2
    assert any("port_max (20000) must be above port_min (30000)" in line for line in lines)
    assert any(line.startswith(f"{path}:5 redis.stream_maxlen:") for line in lines)


def test_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    path = write(tmp_path, "sip:\n  port: [5060\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:") and "YAML syntax error" in line


def test_missing_file() -> None:
    assert errors_of(Path("/nonexistent/config.yaml")) == ["/nonexistent/config.yaml: file not found"]


def test_tls_requires_cert_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "sip:\n  transports: [udp, tls]\n")
    (line,) = errors_of(path)
    assert "tls transport needs tls_cert and tls_key" in line


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    path = write(
        tmp_path, "routes: routes.yaml\nkb_hooks:\n  kb_sets: {hotline: kb/a.yaml}\nengine:\n  model_dir: models/m\n"
    )
    config = load_config(path, {})
    assert config.routes == tmp_path / "routes.yaml"
    assert config.kb_hooks.kb_sets == {"hotline": tmp_path / "kb" / "a.yaml"}
    assert config.engine.model_dir == tmp_path / "models" / "m"


def test_check_config_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gateway_main(["check-config", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.strip() == "ok"
    broken = write(tmp_path, "engine:\n  left_chunks: -3\n")
    assert gateway_main(["check-config", str(broken)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{broken}:2 engine.left_chunks:")


def test_check_config_reports_missing_referenced_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "routes: nowhere.yaml\n")
    assert gateway_main(["check-config", str(path)]) == 1
    assert "nowhere.yaml: file not found" in capsys.readouterr().err


def test_rtp_latch_defaults_to_the_signalled_address(tmp_path: Path) -> None:
    assert load_config(None, {}).rtp.latch == "address"
    assert load_config(EXAMPLE, {}).rtp.latch == "address"
    assert load_config(write(tmp_path, "rtp:\n  latch: strict\n"), {}).rtp.latch == "strict"
    path = write(tmp_path, "rtp:\n  latch: anyone\n")
    (problem,) = errors_of(path)
    assert problem.startswith(f"{path}:2 rtp.latch:") and "'strict', 'address' or 'first'" in problem


def test_check_config_reads_the_analytics_rules_and_the_names_routes_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "analytics.yaml").write_text("checks:\n  - id: hello\n    kind: greeting\n    phrases: []\n")
    (tmp_path / "routes.yaml").write_text("profiles:\n  default:\n    analytics_rules: qa\n")
    path = write(tmp_path, "routes: routes.yaml\nkb_hooks:\n  analytics_rule_sets:\n    hotline: analytics.yaml\n")
    assert gateway_main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'analytics.yaml'}:4 checks.0.phrases:" in err
    assert "profile 'default' analytics_rules 'qa' is not in kb_hooks.analytics_rule_sets (hotline)" in err


def test_check_config_refuses_a_workorder_street_list_the_config_does_not_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "routes.yaml").write_text("profiles:\n  default:\n    workorder:\n      streets: city\n")
    path = write(tmp_path, "routes: routes.yaml\nkb_hooks:\n  street_lists:\n    district: missing.txt\n")
    assert gateway_main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "profile 'default' workorder.streets 'city' is not in kb_hooks.street_lists (district)" in err
    assert f"{tmp_path / 'missing.txt'}: file not found" in err
