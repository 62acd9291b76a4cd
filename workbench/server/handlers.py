"""Thin, authenticated REST handlers over :class:`~workbench.server.manager.PoolManager`.

Every verb is authenticated and authorised (resource ``workbench``); only POST and
DELETE change anything; ``GET pools/<id>/dashboard`` is the pool's live dashboard, polled by
the panel docked beside a notebook; ``GET options`` is the start dialog's fields. Errors come back as
JSON ``{"message": ..., "problem": {...}}`` with the right status: 400 for a malformed request, 404 for an
unknown pool, 409 for a pool that is busy starting or stopping, 503 while the server shuts down.
``message`` is the sentence as the workbench says it anywhere (the magic, a kernel keeping a pool);
``problem`` is the same in the panel's words, as parts (:func:`~workbench.server.panel_words.problem`),
which the page shows as they come.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import tornado
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler

from workbench.server.manager import PoolBusy, PoolManager, PoolNotFound, ShuttingDown
from workbench.server.panel_words import problem
from workbench.server.start_request import interfaces, parse_start_request, start_form
from workbench.widgets.assets import dashboard_js, plotly_js

AUTH_RESOURCE = "workbench"
POOL_ID = r"(?P<pool_id>[A-Za-z0-9_-]+)"


class WorkbenchHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    def initialize(self, manager: PoolManager) -> None:
        self.manager = manager

    def json_body(self):
        """The request's JSON body (``None`` when empty); a 400 with a sentence when it is not JSON."""
        raw = self.request.body.strip()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise tornado.web.HTTPError(400, f"the request body is not valid JSON: {exc}") from None

    def reply(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs) -> None:
        """Jupyter's JSON error (``message``, ``reason``), with the ``problem`` in the panel's words."""
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if not isinstance(exc, tornado.web.HTTPError) or not exc.log_message:
            return super().write_error(status_code, **kwargs)
        self.set_header("Content-Type", "application/json")
        self.log.warning("wrote error: %r", exc.log_message)
        self.finish(json.dumps({"message": exc.log_message, "reason": exc.reason,
                                "problem": problem(exc.log_message)}))

    async def guarded(self, coro):
        """Turn the manager's exceptions into JSON errors with the right status."""
        try:
            return await coro
        except PoolNotFound as exc:
            raise tornado.web.HTTPError(404, str(exc)) from None
        except PoolBusy as exc:
            raise tornado.web.HTTPError(409, str(exc)) from None
        except ShuttingDown as exc:
            raise tornado.web.HTTPError(503, str(exc)) from None
        except ValueError as exc:
            raise tornado.web.HTTPError(400, str(exc)) from None


class InfoHandler(WorkbenchHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        self.reply(self.manager.info())


class InterfacesHandler(WorkbenchHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        """The network interfaces of this machine, for the dialog's Interface field."""
        self.reply({"interfaces": interfaces()})


class OptionsHandler(WorkbenchHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        """The start dialog's fields, made from the config's (:func:`.start_request.start_form`)."""
        form = await asyncio.to_thread(start_form, self.manager.info()["default_n"])
        self.reply(form)


class PoolsHandler(WorkbenchHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        """The pools; ``?count_only=ID,ID``: those without per-rank figures (the panel only counts them)."""
        count_only = frozenset(filter(None, self.get_query_argument("count_only", "").split(",")))
        self.reply({"pools": await self.guarded(self.manager.list_pools(count_only))})

    @tornado.web.authenticated
    @authorized
    async def post(self):
        body = self.json_body()
        try:
            config = parse_start_request(body)
        except ValueError as exc:
            raise tornado.web.HTTPError(400, str(exc)) from None
        self.reply({"pool": await self.guarded(self.manager.start_pool(config))}, status=202)


class PoolHandler(WorkbenchHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, pool_id: str):
        self.reply({"pool": await self.guarded(self.manager.get_pool(pool_id))})

    @tornado.web.authenticated
    @authorized
    async def delete(self, pool_id: str):
        self.reply(await self.guarded(self.manager.stop_pool(pool_id)))


class RestartHandler(WorkbenchHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self, pool_id: str):
        self.json_body()  # nothing to read, but a malformed body is still an error
        self.reply({"pool": await self.guarded(self.manager.restart_pool(pool_id))}, status=202)


class DashboardHandler(WorkbenchHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, pool_id: str):
        """The pool's live dashboard: ``?since=N&view=ID``, what the page has seen (nothing: 0 and "")."""
        try:
            since = int(self.get_query_argument("since", "0"))
        except ValueError:
            raise tornado.web.HTTPError(400, "since must be a whole number (the seq of the last answer).") \
                from None
        view = self.get_query_argument("view", "")
        self.reply(await self.guarded(self.manager.dashboard(pool_id, since, view)))


class StacksHandler(WorkbenchHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, pool_id: str):
        """Every rank's stacks now, grouped (``?native=1``: with native frames, through py-spy)."""
        native = self.get_query_argument("native", "0")
        if native not in ("0", "1"):
            raise tornado.web.HTTPError(400, "native must be 0 or 1.")
        self.reply(await self.guarded(self.manager.stacks(pool_id, native=native == "1")))


class DashboardCodeHandler(WorkbenchHandler):
    FILES = {"dashboard.js": dashboard_js, "plotly.min.js": plotly_js}

    @tornado.web.authenticated
    @authorized
    async def get(self, name: str):
        """The docked dashboard's page code: the notebook widget's module, and plotly.js (no CDN)."""
        path = self.FILES[name]()
        code = await asyncio.to_thread(path.read_bytes)
        self.finish(code, set_content_type="text/javascript; charset=utf-8")


@dataclass(frozen=True)
class Route:
    """One URL of the API: its pattern (under the server's base URL), handler, and an example path."""

    pattern: str
    handler: type[WorkbenchHandler]
    example: str

    @property
    def methods(self) -> list[str]:
        return [m.upper() for m in ("get", "post", "put", "patch", "delete") if m in vars(self.handler)]


ROUTES = [
    Route("/workbench/info", InfoHandler, "/workbench/info"),
    Route("/workbench/interfaces", InterfacesHandler, "/workbench/interfaces"),
    Route("/workbench/options", OptionsHandler, "/workbench/options"),
    Route("/workbench/pools", PoolsHandler, "/workbench/pools"),
    Route(f"/workbench/pools/{POOL_ID}", PoolHandler, "/workbench/pools/abc123"),
    Route(f"/workbench/pools/{POOL_ID}/restart", RestartHandler, "/workbench/pools/abc123/restart"),
    Route(f"/workbench/pools/{POOL_ID}/dashboard", DashboardHandler, "/workbench/pools/abc123/dashboard"),
    Route(f"/workbench/pools/{POOL_ID}/stacks", StacksHandler, "/workbench/pools/abc123/stacks"),
    Route(r"/workbench/dashboard/(?P<name>dashboard\.js|plotly\.min\.js)", DashboardCodeHandler,
          "/workbench/dashboard/dashboard.js"),
]


def handlers(manager: PoolManager) -> list[tuple]:
    """The (pattern, handler, kwargs) triples for ``ExtensionApp.handlers``."""
    return [(r.pattern, r.handler, {"manager": manager}) for r in ROUTES]
