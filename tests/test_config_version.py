"""The config version a node reports: it moves exactly when a reload puts new files in force."""

from __future__ import annotations

import shutil
from pathlib import Path

from asr_gateway.dev.demo import DATA_DIR, demo_config
from asr_gateway.service import DEMO_MODEL_DIR as MODEL_DIR
from asr_gateway.service import Service


def service_on_copies(tmp_path: Path) -> tuple[Service, Path, Path]:
    for name in ("routes.yaml", "kb.yaml", "tags.yaml"):
        shutil.copy(DATA_DIR / name, tmp_path / name)
    config = demo_config("redis://127.0.0.1:1", MODEL_DIR, tmp_path, max_streams=2)
    config = config.model_copy(
        update={
            "routes": tmp_path / "routes.yaml",
            "kb_hooks": config.kb_hooks.model_copy(
                update={
                    "kb_sets": {"hotline": tmp_path / "kb.yaml"},
                    "tag_rule_sets": {"hotline": tmp_path / "tags.yaml"},
                }
            ),
        }
    )
    return Service(config), tmp_path / "routes.yaml", tmp_path / "kb.yaml"


def test_config_version_follows_what_is_in_force(tmp_path: Path) -> None:
    service, routes, kb = service_on_copies(tmp_path)
    first = service.reloader.config_version
    assert len(first) == 16 and service.reloader.last_reload.ok

    assert service.reloader.reload() is True  # nothing changed on disk: same version
    assert service.reloader.config_version == first

    kb.write_text(kb.read_text(encoding="utf-8") + "\n# a comment changes the bytes\n", encoding="utf-8")
    assert service.reloader.reload() is True
    second = service.reloader.config_version
    assert second != first and service.reloader.last_reload.ok and service.reloader.last_reload.errors == ()

    routes.write_text("profiles: [this is not a mapping\n", encoding="utf-8")
    assert service.reloader.reload() is False
    assert service.reloader.config_version == second  # the broken routes file is not in force
    assert not service.reloader.last_reload.ok
    assert any("routes.yaml" in error for error in service.reloader.last_reload.errors)
