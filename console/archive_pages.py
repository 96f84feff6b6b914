"""The archive in the console: the search page (supervisors and admins), an archived call's
page (its agent, supervisors and admins: the live calls' rule), and the access log (admins).

Every search and every view of an archived call is written to the archive's access log (who,
when, what) before the answer goes out. The store is synchronous (sqlite3, psycopg): its calls
run on a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from archive.store import DEFAULT_PAGE_SIZE, ArchiveStore, CallQuery, CallRecord
from console.users import User

Handler = Callable[[Request], Awaitable[Response]]
Need = Callable[..., Callable[[Handler], Handler]]
Page = Callable[..., Response]
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
CRITERIA = ("phrase", "tag", "address", "agent", "route", "from", "to")


def query_of(params: dict[str, str]) -> CallQuery:
    """The search form's fields (dates as YYYY-MM-DD, UTC; ``to`` inclusive) as a ``CallQuery``;
    ``after`` is the previous page's last hit, ``started_at|call_id``."""

    def given(name: str) -> str | None:
        value = params.get(name, "").strip()
        return value[:200] or None

    def day(name: str) -> str | None:
        value = given(name)
        if value is None:
            return None
        if not _DATE.match(value):
            raise ValueError(f"{name}: a date is YYYY-MM-DD, not {value!r}")
        return value

    start, end = day("from"), day("to")
    after = given("after")
    cursor = tuple(after.split("|", 1)) if after and "|" in after else None
    return CallQuery(
        phrase=given("phrase"), tag=given("tag"), address=given("address"), agent=given("agent"),
        route=given("route"), started_from=f"{start}T00:00:00.000Z" if start else None,
        started_to=f"{end}T23:59:59.999Z" if end else None,
        after=(cursor[0], cursor[1]) if cursor else None, limit=DEFAULT_PAGE_SIZE,
    )  # fmt: skip


def may_see(user: User, record: CallRecord) -> bool:
    """The live calls' rule: supervisors and admins see every call, an agent only their own."""
    return user.at_least("supervisor") or (record.agent is not None and record.agent == user.agent_id)


def archive_routes(store: Callable[[], ArchiveStore | None], need: Need, page: Page) -> list[Route]:
    """The routes; ``store()`` is None while the console has no ``archive_db`` (the pages say so)."""

    def no_archive(request: Request) -> Response:
        return page("archive_search.html", request, status_code=503, configured=False, form={}, hits=[],
                    more=None, error=None)  # fmt: skip

    async def record_for(request: Request) -> tuple[ArchiveStore, CallRecord] | None:
        archive = store()
        call_id = request.path_params["call_id"]
        user: User = request.state.user
        if archive is None:
            return None
        record = await asyncio.to_thread(archive.call, call_id)
        if record is None or not may_see(user, record):
            await asyncio.to_thread(archive.log_access, user.name, "view-refused", {"call_id": call_id})
            return None
        await asyncio.to_thread(archive.log_access, user.name, "view", {"call_id": call_id})
        return archive, record

    @need("supervisor", page=True)
    async def search_page(request: Request) -> Response:
        archive = store()
        if archive is None:
            return no_archive(request)
        form = {name: request.query_params.get(name, "") for name in CRITERIA}
        user: User = request.state.user
        try:
            query = query_of(dict(request.query_params))
        except ValueError as exc:
            return page("archive_search.html", request, status_code=400, configured=True, form=form, hits=[],
                        more=None, error=str(exc))  # fmt: skip
        searched = any(form.values())
        hits, next_after = [], None
        if searched:
            await asyncio.to_thread(archive.log_access, user.name, "search", {k: v for k, v in form.items() if v})
            found = await asyncio.to_thread(archive.search, query)
            hits, next_after = found.hits, found.next_after
        more = None
        if next_after is not None:
            more = "/archive?" + urlencode({**{k: v for k, v in form.items() if v}, "after": "|".join(next_after)})
        return page("archive_search.html", request, configured=True, form=form, hits=hits, searched=searched,
                    more=more, error=None)  # fmt: skip

    @need("agent", page=True)
    async def call_page(request: Request) -> Response:
        found = await record_for(request)
        if found is None:
            return page("missing.html", request, status_code=404, call_id=request.path_params["call_id"])
        record = found[1]
        confirmed = [w for w in record.workorders if w["kind"] == "confirmed"]
        drafts = [w for w in record.workorders if w["kind"] == "draft"]
        workorder = (confirmed or drafts)[-1] if confirmed or drafts else None
        return page("archive_call.html", request, call=record, workorder=workorder)

    @need("supervisor")
    async def api_search(request: Request) -> Response:
        archive = store()
        if archive is None:
            return JSONResponse({"error": "the console has no archive_db"}, status_code=503)
        user: User = request.state.user
        try:
            query = query_of(dict(request.query_params))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        what = {k: v for k, v in request.query_params.items() if k in CRITERIA and v}
        await asyncio.to_thread(archive.log_access, user.name, "search", what)
        found = await asyncio.to_thread(archive.search, query)
        return JSONResponse({"calls": [asdict(h) for h in found.hits],
                             "next_after": "|".join(found.next_after) if found.next_after else None})  # fmt: skip

    @need("agent")
    async def api_call(request: Request) -> Response:
        found = await record_for(request)
        if found is None:
            return JSONResponse({"error": f"no archived call {request.path_params['call_id']}"}, status_code=404)
        return JSONResponse({"call": asdict(found[1])})

    @need("admin")
    async def api_access_log(request: Request) -> Response:
        archive = store()
        if archive is None:
            return JSONResponse({"error": "the console has no archive_db"}, status_code=503)
        entries = await asyncio.to_thread(archive.access_log, 500)
        return JSONResponse({"access": [asdict(e) for e in entries]})

    return [
        Route("/archive", search_page),
        Route("/archive/calls/{call_id}", call_page),
        Route("/api/archive/calls", api_search),
        Route("/api/archive/calls/{call_id}", api_call),
        Route("/api/archive/access", api_access_log),
    ]
