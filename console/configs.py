"""The admin side: the gateways' routing, KB, tag and analytics rules and street files; validation,
*try it*, apply, versions, rollback, audit log and the versions the gateways report.

Files are named by key: ``routes``, ``kb:NAME``, ``tags:NAME``, ``analytics:NAME`` and
``streets:NAME`` (the names of the service config's ``kb_hooks.kb_sets``, ``tag_rule_sets``,
``analytics_rule_sets`` and ``street_lists``). Validation runs ``check-config``'s own
checks on the draft (written next to the real file, so relative paths resolve the same way)
and reports its ``file:line`` messages under the real file's name. *Apply* writes the file
atomically (temporary file, fsync, rename), keeps the new content as a version (time, user,
unified diff against what it replaced; the content before the first apply is kept too, as
version "before console"), appends to the audit log and asks every gateway to reload on
``{prefix}:control``. Rollback applies a kept version's content again, as a new version.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from asr_common.yamlconf import ConfigError
from asr_gateway.call_context import profile_context
from asr_gateway.config import ServiceConfig, load_config
from asr_gateway.heartbeat import RELOAD_MESSAGE, control_channel, nodes_key
from calls.profile import Profile
from kb_hooks.events import Event, KbSuggestion, Tags, TranscriptFinal
from kb_hooks.features import FEATURES, NodeDefaults, Registry
from kb_hooks.processor import TranscriptProcessor
from kb_hooks.types import CallContext, Participant, TranscriptUpdate

NODE_STALE_S = 10.0
NODE_FORGET_S = 86_400.0
MAX_FILE_BYTES = 4 << 20

TRY_IT_CALL_ID = "try-it"


class UnknownFile(KeyError):
    pass


@dataclass(frozen=True)
class TryIt:
    """What try-it ran: the profile, the routes file's profiles, the call's context and its events."""

    profile: str
    profiles: list[str]
    ctx: CallContext
    events: list[Event]


@dataclass(frozen=True)
class Version:
    id: int
    key: str
    at: float
    user: str
    comment: str
    sha256: str
    diff: str
    content: str

    def meta(self) -> dict[str, Any]:
        return {"id": self.id, "key": self.key, "at": self.at, "user": self.user, "comment": self.comment,
                "sha256": self.sha256[:16], "diff_lines": self.diff.count("\n")}  # fmt: skip


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def atomic_write(path: Path, content: str) -> None:
    """Write ``content`` to ``path`` so readers see the old or the new file, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(OSError):
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class ConfigStore:
    """The files the gateways run, as the console edits them."""

    def __init__(
        self, service_config: Path, state_dir: Path, client: aioredis.Redis, features: Registry = FEATURES
    ) -> None:
        self.features = features  # the service's: its files are edited here, try-it runs them
        self.service_config_path = service_config
        self.config: ServiceConfig = load_config(service_config)
        self.state_dir = state_dir
        self.versions_dir = state_dir / "versions"
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self.audit_path = state_dir / "audit.jsonl"
        self.client = client
        self.prefix = self.config.redis.key_prefix
        self._lock = asyncio.Lock()

    # -- files ------------------------------------------------------------------------

    def files(self) -> dict[str, Path]:
        hooks = self.config.kb_hooks
        out: dict[str, Path] = {}
        if self.config.routes is not None:
            out["routes"] = self.config.routes
        for file_set in self.features.file_sets():
            out.update({f"{file_set.kind}:{name}": path for name, path in file_set.paths(hooks).items()})
        return out

    def path_of(self, key: str) -> Path:
        path = self.files().get(key)
        if path is None:
            raise UnknownFile(key)
        return path

    def shown_path(self, key: str) -> str:
        """The file's path as the admin page shows it: relative to the service config when below it."""
        path = self.path_of(key)
        try:
            return str(path.relative_to(self.service_config_path.resolve().parent))
        except ValueError:
            return str(path)

    def read(self, key: str) -> str:
        return self.path_of(key).read_text(encoding="utf-8")

    # -- validation -------------------------------------------------------------------

    def _with_path(self, config: ServiceConfig, key: str, path: Path) -> ServiceConfig:
        kind, _, name = key.partition(":")
        if kind == "routes":
            return config.model_copy(update={"routes": path})
        hooks = config.kb_hooks
        file_set = self.features.file_set(kind)
        sets = {**file_set.paths(hooks), name: path}
        return config.model_copy(update={"kb_hooks": hooks.model_copy(update={file_set.setting: sets})})

    @contextlib.contextmanager
    def _drafts(self, drafts: dict[str, str]) -> Any:
        """The service config with each drafted file replaced by a temporary copy beside it."""
        config = self.config
        made: list[tuple[Path, Path]] = []
        try:
            for key, content in drafts.items():
                real = self.path_of(key)
                fd, name = tempfile.mkstemp(dir=real.parent, prefix=f".{real.stem}.draft-", suffix=real.suffix)
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(content)
                made.append((Path(name), real))
                config = self._with_path(config, key, Path(name))
            yield config, made
        finally:
            for tmp, _ in made:
                with contextlib.suppress(OSError):
                    tmp.unlink()

    def validate(self, key: str, content: str) -> list[str]:
        """``check-config``'s messages for the service config with ``key`` replaced by ``content``."""
        from asr_gateway.config_check import check_referenced_files

        if len(content.encode()) > MAX_FILE_BYTES:
            return [f"{self.path_of(key)}: larger than {MAX_FILE_BYTES} bytes"]
        with self._drafts({key: content}) as (config, made):
            try:
                problems = check_referenced_files(config, self.features)
            except ConfigError as exc:
                problems = list(exc.errors)
            for tmp, real in made:
                problems = [line.replace(str(tmp), str(real)) for line in problems]
        return problems

    def try_events(self, text: str, profile_name: str | None, drafts: dict[str, str]) -> TryIt:
        """What the service would publish for ``text`` as the caller's final on a call of the
        profile (the routes' default where None): the service's features (``self.features``),
        its processor and its call context (``asr_gateway.call_context``), drafts (unapplied
        edits) included. A file that does not load: ConfigError, under its real name."""
        from calls.routing import load_routes

        with self._drafts(drafts) as (config, made):
            try:
                router = load_routes(config.routes) if config.routes is not None else None
                processor = TranscriptProcessor.from_settings(config.kb_hooks, self.features)
            except ConfigError as exc:
                errors = list(exc.errors)
                for tmp, real in made:
                    errors = [line.replace(str(tmp), str(real)) for line in errors]
                raise ConfigError(errors) from None
        profiles = router.routes.profiles if router is not None else {}
        name = profile_name or (router.routes.default_profile if router is not None else None) or "default"
        profile = profiles.get(name) or Profile(name=name)
        node = NodeDefaults.from_settings(config.kb_hooks)
        ctx = profile_context(profile, node, call_id=TRY_IT_CALL_ID, route=name, features=processor.features)
        update = TranscriptUpdate(ctx, Participant("caller"), 0, False, text)
        return TryIt(name, sorted(profiles), ctx, processor.process(update))

    def try_text(self, text: str, profile_name: str | None, drafts: dict[str, str]) -> dict[str, Any]:
        """What the service would publish for ``text`` as a final: redacted transcript, KB
        suggestions (score, homophone), tags and entities; drafts (unapplied edits) included."""
        try:
            tried = self.try_events(text, profile_name, drafts)
        except ConfigError as exc:
            return {"errors": list(exc.errors)}
        events = tried.events
        return {
            "profile": tried.profile,
            "profiles": tried.profiles,
            "redaction": tried.ctx.redaction.value,
            "text": next((e.text for e in events if isinstance(e, TranscriptFinal)), ""),
            "suggestions": [e.to_json() for e in events if isinstance(e, KbSuggestion)],
            "tags": [t.to_json() for e in events if isinstance(e, Tags) for t in e.tags],
            "events": [e.to_json() for e in events],  # every feature's, the work-order draft's included
        }

    # -- apply, versions, rollback ----------------------------------------------------

    def _version_files(self) -> list[Path]:
        return sorted(self.versions_dir.glob("*.json"))

    def _load_version(self, path: Path) -> Version:
        return Version(**json.loads(path.read_text(encoding="utf-8")))

    def versions(self, key: str | None = None) -> list[Version]:
        out = [self._load_version(p) for p in self._version_files()]
        return [v for v in out if key is None or v.key == key]

    def version(self, version_id: int) -> Version:
        path = self.versions_dir / f"{version_id:06d}.json"
        if not path.is_file():
            raise KeyError(version_id)
        return self._load_version(path)

    def _keep(self, key: str, user: str, comment: str, content: str, previous: str | None) -> Version:
        files = self._version_files()
        next_id = int(files[-1].stem) + 1 if files else 1
        real = str(self.path_of(key))
        diff = "".join(difflib.unified_diff(
            (previous or "").splitlines(keepends=True), content.splitlines(keepends=True), real, real
        ))  # fmt: skip
        version = Version(next_id, key, time.time(), user, comment, sha256(content), diff, content)
        target = self.versions_dir / f"{next_id:06d}.json"
        atomic_write(target, json.dumps(version.__dict__, ensure_ascii=False))
        return version

    async def apply(self, key: str, content: str, user: str, comment: str = "", peer: str = "") -> dict[str, Any]:
        """Validate, write atomically, keep the version, audit, ask the gateways to reload."""
        async with self._lock:
            path = self.path_of(key)
            errors = await asyncio.to_thread(self.validate, key, content)
            if errors:
                self.audit(user, "apply-rejected", {"key": key, "errors": errors}, peer)
                return {"ok": False, "errors": errors}
            previous = path.read_text(encoding="utf-8") if path.is_file() else None
            if not self.versions(key) and previous is not None:
                self._keep(key, "(before console)", "the file as it was before the first apply", previous, None)
            version = self._keep(key, user, comment, content, previous)
            await asyncio.to_thread(atomic_write, path, content)
            receivers = await self.request_reload()
            self.audit(user, "apply", {"key": key, "version": version.id, "sha256": version.sha256[:16],
                                       "comment": comment, "reload_receivers": receivers}, peer)  # fmt: skip
            return {"ok": True, "version": version.meta(), "reload_receivers": receivers, "applied_at": version.at}

    async def rollback(self, version_id: int, user: str, peer: str = "") -> dict[str, Any]:
        version = self.version(version_id)
        self.audit(user, "rollback", {"key": version.key, "to_version": version_id}, peer)
        return await self.apply(version.key, version.content, user, f"rollback to version {version_id}", peer)

    async def request_reload(self) -> int:
        """Publish ``reload`` to the gateways; returns how many received it."""
        receivers: int = await self.client.publish(control_channel(self.prefix), RELOAD_MESSAGE)
        return receivers

    # -- audit and nodes ----------------------------------------------------------------

    def audit(self, user: str, action: str, details: dict[str, Any], peer: str = "") -> None:
        record = {"at": time.time(), "user": user, "action": action, "peer": peer, **details}
        with self.audit_path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")

    def audit_log(self, limit: int = 200) -> list[dict[str, Any]]:
        if not self.audit_path.is_file():
            return []
        lines = self.audit_path.read_text(encoding="utf-8").splitlines()[-limit:]
        out = []
        for line in reversed(lines):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    async def nodes(self) -> list[dict[str, Any]]:
        """Each gateway's last heartbeat, with ``stale`` when it is older than NODE_STALE_S."""
        raw = await self.client.hgetall(nodes_key(self.prefix))
        now = time.time()
        out = []
        for field, value in raw.items():
            try:
                node = json.loads(value)
            except ValueError:
                continue
            age = now - float(node.get("ts", 0))
            if age > NODE_FORGET_S:
                await self.client.hdel(nodes_key(self.prefix), field)
                continue
            node["stale"] = age > NODE_STALE_S
            out.append(node)
        return sorted(out, key=lambda n: str(n.get("node")))
