"""The console's web app (Starlette): pages, the calls API with SSE, the admin API, sign-in.

Every route but ``/health``, ``/login`` and ``/static`` needs a signed-in user (session cookie:
signed, HttpOnly, SameSite=Strict, Secure under TLS) or, from a trusted proxy address, the
configured proxy header naming a user of the users file. Every write (POST) needs the
session's CSRF token in the ``X-CSRF-Token`` header (forms: the ``csrf_token`` field).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from archive.store import ArchiveStore, open_store
from asr_common.yamlconf import ConfigError
from asr_core.model.bundled import BUNDLED_MODEL_DIR, is_demo_model
from console.archive_pages import archive_routes, may_see
from console.configs import ConfigStore, UnknownFile
from console.feeds import CallIndex, CallSummary, Hub, call_snapshot, fold_event, running_hub
from console.route_sizes import RouteChunkSizes
from console.settings import ConsoleSettings
from console.speak import SpeakTarget, demo_model_notice, speak_target
from console.users import Role, User, Users
from console.webhooks import Backoff, Outbox, WebhookSender
from console.workorders import ConfirmError, append_after, confirmation, route_profile, webhook_delivery
from kb_hooks.config import RedisSettings
from kb_hooks.connection import make_client
from kb_hooks.events import EventType

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
SSE_PING_S = 15
LIST_MIN_INTERVAL_S = 0.25
SESSION_COOKIE = "asr_console"


def session_key(state_dir: Path) -> str:
    """The cookie-signing key, made once and kept (0600) in the state directory."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "session.key"
    if not path.is_file():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    return path.read_text().strip()


class Console:
    """What the routes share: settings, users, Redis, the hub of call feeds, the config store."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.users = Users(settings.users_file)
        self.store: ConfigStore | None = None
        self.client: aioredis.Redis | None = None
        self.redis = RedisSettings()
        self.routes: Path | None = None
        self.hub: Hub | None = None
        self.speak: SpeakTarget | None = None
        self.configured_demo_model = False  # the gateway's config serves the bundled demo model
        self.route_sizes = RouteChunkSizes(None)
        self.archive: ArchiveStore | None = None  # archive_db: calls kept after they end (docs/archive.md)
        backoff = Backoff(settings.webhook_retry_first_s, settings.webhook_retry_max_s)
        self.webhooks = WebhookSender(Outbox(settings.state_dir / "webhook-outbox.jsonl"), backoff)

    def open(self) -> None:
        from asr_gateway.config import load_config

        service = load_config(self.settings.service_config)
        redis = self.redis = service.redis
        self.routes = service.routes
        self.speak = speak_target(self.settings.speak_url, service.websocket)
        self.configured_demo_model = is_demo_model(service.engine.model_dir or BUNDLED_MODEL_DIR)
        self.client = make_client(redis.url, redis.connect_timeout_s, 5.0)
        prefixes = self.settings.key_prefixes or [redis.key_prefix]
        self.route_sizes = RouteChunkSizes(service.routes)
        index = CallIndex(self.settings.agent_id_key, self.settings.ended_keep_s, self.route_sizes)
        self.hub = Hub(self.client, prefixes, index, self.settings.bootstrap_events, redis.layout)
        self.store = ConfigStore(self.settings.service_config, self.settings.state_dir, self.client)
        if self.settings.archive_db:
            self.archive = open_store(self.settings.archive_db)

    # -- who is asking ----------------------------------------------------------------

    def user_of(self, request: Request) -> User | None:
        header = self.settings.proxy_header
        if header and request.client is not None and header in request.headers:
            with contextlib.suppress(ValueError):
                peer = ipaddress.ip_address(request.client.host)
                if any(peer in net for net in self.settings.trusted_proxies):
                    return self.users.get(request.headers[header])
        name = request.session.get("user")
        return self.users.get(name) if isinstance(name, str) else None

    def can_see(self, user: User, call: CallSummary | None) -> bool:
        if user.at_least("supervisor"):
            return True
        return call is not None and call.agent_id is not None and call.agent_id == user.agent_id


def csrf_token(request: Request) -> str:
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = request.session["csrf"] = secrets.token_urlsafe(32)
    return token


def _csrf_ok(request: Request, given: str | None) -> bool:
    token = request.session.get("csrf")
    return isinstance(token, str) and isinstance(given, str) and hmac.compare_digest(token, given)


Handler = Callable[[Request], Awaitable[Response]]


def build_app(settings: ConsoleSettings) -> Starlette:
    console = Console(settings)
    templates = Jinja2Templates(directory=str(HERE / "templates"))

    def need(role: Role, page: bool = False) -> Callable[[Handler], Handler]:
        def wrap(handler: Handler) -> Handler:
            async def endpoint(request: Request) -> Response:
                user = console.user_of(request)
                if user is None:
                    if page:
                        return RedirectResponse(f"/login?next={request.url.path}", status_code=303)
                    return JSONResponse({"error": "sign in first"}, status_code=401)
                if not user.at_least(role):
                    return JSONResponse({"error": f"needs role {role}"}, status_code=403)
                if request.method not in ("GET", "HEAD") and not _csrf_ok(request, request.headers.get("x-csrf-token")):
                    return JSONResponse({"error": "missing or wrong CSRF token"}, status_code=403)
                request.state.user = user
                return await handler(request)

            return endpoint

        return wrap

    def page(name: str, request: Request, status_code: int = 200, **extra: Any) -> Response:
        user: User = request.state.user
        context = {"user": user, "csrf": csrf_token(request), **extra}
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    def store() -> ConfigStore:
        assert console.store is not None
        return console.store

    def hub() -> Hub:
        assert console.hub is not None
        return console.hub

    async def body(request: Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except ValueError:
            raise HTTPException(400, "body must be JSON") from None
        if not isinstance(data, dict):
            raise HTTPException(400, "body must be a JSON object")
        return data

    def peer(request: Request) -> str:
        return request.client.host if request.client else ""

    # -- public -------------------------------------------------------------------------

    async def health(request: Request) -> Response:
        assert console.client is not None
        with contextlib.suppress(RedisError, OSError):
            await console.client.ping()
            return JSONResponse({"ok": True, "redis": True})
        return JSONResponse({"ok": False, "redis": False}, status_code=503)

    async def login_page(request: Request) -> Response:
        context = {"csrf": csrf_token(request), "next": request.query_params.get("next", "/"), "error": None}
        return templates.TemplateResponse(request, "login.html", context)

    async def login(request: Request) -> Response:
        form = await request.form()
        next_url = str(form.get("next") or "/")
        if not next_url.startswith("/") or next_url.startswith("//"):
            next_url = "/"
        if not _csrf_ok(request, str(form.get("csrf_token") or "")):
            return JSONResponse({"error": "missing or wrong CSRF token"}, status_code=403)
        name, password = str(form.get("username") or ""), str(form.get("password") or "")
        user = console.users.authenticate(name, password)
        store().audit(name, "login" if user else "login-failed", {}, peer(request))
        if user is None:
            context = {"csrf": csrf_token(request), "next": next_url, "error": "wrong user name or password"}
            return templates.TemplateResponse(request, "login.html", context, status_code=401)
        request.session.clear()
        request.session["user"] = user.name
        request.session["csrf"] = secrets.token_urlsafe(32)
        return RedirectResponse(next_url, status_code=303)

    @need("agent")
    async def logout(request: Request) -> Response:
        request.session.clear()
        return RedirectResponse("/login", status_code=303)

    # -- pages --------------------------------------------------------------------------

    @need("agent", page=True)
    async def calls_page(request: Request) -> Response:
        return page("calls.html", request)

    @need("agent", page=True)
    async def call_page(request: Request) -> Response:
        try:
            call = await find_call(request)
        except HTTPException:  # another agent's call, or none: 404, as the API answers
            call_id = request.path_params["call_id"]
            archived = await asyncio.to_thread(console.archive.call, call_id) if console.archive else None
            if archived is not None and may_see(request.state.user, archived):
                return RedirectResponse(f"/archive/calls/{call_id}", status_code=303)  # its view is logged there
            return page("missing.html", request, status_code=404, call_id=request.path_params["call_id"])
        return page("call.html", request, call_id=call.call_id, agent_id_key=settings.agent_id_key,
                    route_chunk_ms=console.route_sizes(call.route))  # fmt: skip

    @need("agent", page=True)
    async def speak_page(request: Request) -> Response:
        assert console.speak is not None
        nodes: list[dict[str, Any]] = []
        with contextlib.suppress(RedisError, OSError):  # no heartbeats to read: the config decides
            nodes = await store().nodes()
        notice = demo_model_notice(nodes, console.configured_demo_model)
        return page("speak.html", request, target=console.speak, model_notice=notice)

    @need("supervisor", page=True)
    async def analytics_page(request: Request) -> Response:
        return page("analytics.html", request)

    @need("admin", page=True)
    async def admin_page(request: Request) -> Response:
        return page("admin.html", request)

    # -- calls API ----------------------------------------------------------------------

    @need("agent")
    async def me(request: Request) -> Response:
        user: User = request.state.user
        return JSONResponse({"user": user.name, "role": user.role, "agent_id": user.agent_id,
                             "csrf": csrf_token(request)})  # fmt: skip

    def visible_calls(user: User) -> list[dict[str, Any]]:
        calls = [c for c in hub().index.calls.values() if console.can_see(user, c)]
        calls.sort(key=lambda c: (c.ended_at is not None, c.started_at or ""), reverse=False)
        return [c.to_json() for c in calls]

    @need("agent")
    async def api_calls(request: Request) -> Response:
        await hub().ready.wait()
        return JSONResponse({"calls": visible_calls(request.state.user)})

    @need("agent")
    async def api_calls_stream(request: Request) -> Response:
        user: User = request.state.user

        async def events() -> AsyncIterator[dict[str, str]]:
            await hub().ready.wait()
            index = hub().index
            while True:
                changed = index.changed
                yield {"event": "calls", "data": json.dumps({"calls": visible_calls(user)}, ensure_ascii=False)}
                await changed.wait()
                await asyncio.sleep(LIST_MIN_INTERVAL_S)  # partials change the list often: batch them

        return EventSourceResponse(events(), ping=SSE_PING_S)

    async def find_call(request: Request) -> CallSummary:
        """A call the user may see; 404 otherwise (also for others' calls)."""
        call_id = request.path_params["call_id"]
        user: User = request.state.user
        await hub().ready.wait()
        summary = hub().index.calls.get(call_id)
        if summary is None:
            for prefix in hub().prefixes:
                stored = await call_snapshot(hub().client, prefix, call_id, hub().layout)
                if stored:
                    summary = CallSummary(call_id, prefix)
                    for _, event in stored:
                        fold_event(summary, event, hub().index.agent_id_key, console.route_sizes)
                    break
        if summary is None or not console.can_see(user, summary):
            raise HTTPException(404, f"no call {call_id}")
        return summary

    @need("agent")
    async def api_call(request: Request) -> Response:
        call = await find_call(request)
        prefix, call_id = call.prefix, call.call_id
        stored = await call_snapshot(hub().client, prefix, call_id, hub().layout)
        summary = hub().index.calls.get(call_id)
        return JSONResponse({
            "call": summary.to_json() if summary else {"call_id": call_id},
            "events": [{"stream_id": sid, **event} for sid, event in stored],
        })  # fmt: skip

    @need("agent")
    async def api_call_events(request: Request) -> Response:
        call = await find_call(request)
        prefix, call_id = call.prefix, call.call_id
        last_id = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        feed = hub().feed(prefix, call_id)

        async def events() -> AsyncIterator[dict[str, str]]:
            async for item in feed.follow(last_id):
                if item.stream_id is None:
                    yield {"data": item.data}
                else:
                    yield {"id": item.stream_id, "data": item.data}

        return EventSourceResponse(events(), ping=SSE_PING_S)

    @need("agent")
    async def api_confirm_workorder(request: Request) -> Response:
        """The agent confirms the call's work order (``{"fields": {name: value}}``): ``workorder.confirmed``."""
        call = await find_call(request)
        prefix, call_id = call.prefix, call.call_id
        data = await body(request)
        fields = data.get("fields") or {}
        if not isinstance(fields, dict):
            raise HTTPException(400, "fields must map work-order field names to values")
        stored = await call_snapshot(hub().client, prefix, call_id, hub().layout)
        user: User = request.state.user
        try:
            event = confirmation([e for _, e in stored], fields, user.name)
            wire = await append_after(hub().client, console.redis, hub().layout, prefix, stored, event)
        except ConfirmError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except (RedisError, OSError) as exc:
            return JSONResponse({"error": f"Redis is unreachable, nothing was confirmed: {exc}"}, status_code=503)
        details = {"call_id": call_id, "changes": len(event.changes)}
        store().audit(user.name, "workorder-confirmed", details, peer(request))
        try:
            delivery = webhook_delivery(route_profile(console.routes, event.route), wire)
        except ConfigError as exc:
            log.error("work order %s confirmed, not sent to a ticket system: the routes file is broken: %s",
                      event.workorder_id, exc)  # fmt: skip
            delivery = None
        if delivery is not None:
            console.webhooks.outbox.add(delivery)
            console.webhooks.wake()
        return JSONResponse({"ok": True, "event": wire, "webhook": "queued" if delivery else None})

    @need("agent")
    async def api_workorder_deliveries(request: Request) -> Response:
        """Where each of the call's confirmed work orders stands with the ticket system, by the
        ``workorder.confirmed`` event id (one the route sends no webhook for, or one finished
        before this console started, is not there)."""
        call = await find_call(request)
        stored = await call_snapshot(hub().client, call.prefix, call.call_id, hub().layout)
        confirmed = [str(e.get("event_id")) for _, e in stored if e.get("event_type") == EventType.WORKORDER_CONFIRMED]
        states = [console.webhooks.state(event_id) for event_id in confirmed]
        return JSONResponse({"deliveries": {s.event_id: s.to_json() for s in states if s is not None}})

    # -- admin API ----------------------------------------------------------------------

    def file_key(data: dict[str, Any]) -> str:
        key = data.get("key")
        if not isinstance(key, str) or key not in store().files():
            raise HTTPException(404, f"no such file key {key!r}; known: {', '.join(store().files())}")
        return key

    def content_of(data: dict[str, Any]) -> str:
        content = data.get("content")
        if not isinstance(content, str):
            raise HTTPException(400, "content must be a string")
        return content

    @need("admin")
    async def admin_files(request: Request) -> Response:
        files = [{"key": key, "path": store().shown_path(key)} for key in store().files()]
        return JSONResponse({"files": files})

    @need("admin")
    async def admin_file(request: Request) -> Response:
        key = request.path_params["key"]
        try:
            content = store().read(key)
        except UnknownFile:
            raise HTTPException(404, f"no such file key {key!r}") from None
        versions = [v.meta() for v in reversed(store().versions(key))]
        return JSONResponse({"key": key, "path": store().shown_path(key), "content": content, "versions": versions})

    @need("admin")
    async def admin_validate(request: Request) -> Response:
        data = await body(request)
        errors = store().validate(file_key(data), content_of(data))
        return JSONResponse({"ok": not errors, "errors": errors})

    @need("admin")
    async def admin_try(request: Request) -> Response:
        data = await body(request)
        text = data.get("text")
        if not isinstance(text, str) or not text.strip():
            raise HTTPException(400, "text must be a non-empty string")
        drafts = data.get("drafts") or {}
        if not isinstance(drafts, dict) or not all(isinstance(v, str) for v in drafts.values()):
            raise HTTPException(400, "drafts must map file keys to contents")
        for key in drafts:
            file_key({"key": key})
        profile = data.get("profile")
        return JSONResponse(store().try_text(text[:2000], profile if isinstance(profile, str) else None, drafts))

    @need("admin")
    async def admin_apply(request: Request) -> Response:
        data = await body(request)
        comment = str(data.get("comment") or "")[:500]
        result = await store().apply(file_key(data), content_of(data), request.state.user.name, comment, peer(request))
        return JSONResponse(result, status_code=200 if result["ok"] else 422)

    @need("admin")
    async def admin_rollback(request: Request) -> Response:
        data = await body(request)
        try:
            result = await store().rollback(int(data.get("version", -1)), request.state.user.name, peer(request))
        except (KeyError, ValueError, TypeError):
            raise HTTPException(404, f"no version {data.get('version')!r}") from None
        return JSONResponse(result, status_code=200 if result["ok"] else 422)

    @need("admin")
    async def admin_versions(request: Request) -> Response:
        key = request.query_params.get("key")
        return JSONResponse({"versions": [v.meta() for v in reversed(store().versions(key))]})

    @need("admin")
    async def admin_version(request: Request) -> Response:
        try:
            version = store().version(int(request.path_params["version_id"]))
        except (KeyError, ValueError):
            raise HTTPException(404, "no such version") from None
        return JSONResponse({**version.meta(), "diff": version.diff, "content": version.content})

    @need("admin")
    async def admin_audit(request: Request) -> Response:
        return JSONResponse({"audit": store().audit_log()})

    @need("supervisor")
    async def admin_nodes(request: Request) -> Response:
        return JSONResponse({"nodes": await store().nodes()})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.open()
        assert console.hub is not None and console.client is not None
        console.webhooks.start()
        async with running_hub(console.hub):
            yield
        await console.webhooks.stop()
        await console.client.aclose()
        if console.archive is not None:
            console.archive.close()

    routes = [
        Route("/health", health),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", calls_page),
        Route("/calls/{call_id}", call_page),
        Route("/speak", speak_page),
        Route("/analytics", analytics_page),
        Route("/admin", admin_page),
        Route("/api/me", me),
        Route("/api/calls", api_calls),
        Route("/api/calls/stream", api_calls_stream),
        Route("/api/calls/{call_id}", api_call),
        Route("/api/calls/{call_id}/events", api_call_events),
        Route("/api/calls/{call_id}/workorder", api_confirm_workorder, methods=["POST"]),
        Route("/api/calls/{call_id}/workorder", api_workorder_deliveries, methods=["GET"]),
        Route("/api/admin/files", admin_files),
        Route("/api/admin/files/{key}", admin_file),
        Route("/api/admin/validate", admin_validate, methods=["POST"]),
        Route("/api/admin/try", admin_try, methods=["POST"]),
        Route("/api/admin/apply", admin_apply, methods=["POST"]),
        Route("/api/admin/rollback", admin_rollback, methods=["POST"]),
        Route("/api/admin/versions", admin_versions),
        Route("/api/admin/versions/{version_id}", admin_version),
        Route("/api/admin/audit", admin_audit),
        Route("/api/admin/nodes", admin_nodes),
        *archive_routes(lambda: console.archive, need, page),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    middleware = [
        Middleware(SessionMiddleware, secret_key=session_key(settings.state_dir), session_cookie=SESSION_COOKIE,
                   max_age=settings.session_max_age_s, same_site="strict", https_only=settings.secure_cookies),
    ]  # fmt: skip
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})  # fmt: skip
    app.state.console = console
    return app
