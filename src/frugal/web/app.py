"""`frugal dashboard`: a local web app over the ledger (FastAPI, served by uvicorn).

Security: it binds to loopback by default. On any other address every request must carry
the token (`FRUGAL_DASHBOARD_TOKEN`, or one generated and printed once at start): as
`Authorization: Bearer TOKEN`, or `?token=TOKEN` once in a browser, which then keeps it in
an HTTP-only cookie. Every route is a GET that only reads the books, but one: the Plan
form's POST /api/plans plans and records its plan, as `frugal plan` does, and takes only a
JSON body (which a page of another site cannot send it without asking first).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from frugal.ledger.store import Ledger
from frugal.web import api, pages

COOKIE = "frugal_token"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def create_app(url: str | None = None, token: str | None = None) -> FastAPI:
    """The dashboard over the ledger at `url` (default: frugal's); with `token`, every
    request must carry it."""
    # FastAPI's own docs page loads Swagger UI from a CDN, blank offline: fastapi-offline
    # serves the same page with Swagger UI's files from the installed package
    app = FastAPIOffline(
        title="frugal dashboard",
        description="The books of frugal's plans and runs: spend, budgets, runs, plans.",
        docs_url="/api/docs",
        openapi_url="/api/openapi.json",
        redoc_url=None,
        static_url="/static/api-docs",
    )
    app.state.ledger = Ledger(url)
    app.include_router(api.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=str(pages.HERE / "static")), name="static")

    if token:
        app.middleware("http")(_require(token))
    return app


def _require(
    token: str,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    expected = token.encode()

    async def check(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        auth = request.headers.get("authorization", "")
        given = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        from_query = request.query_params.get("token", "")
        given = given or from_query or request.cookies.get(COOKIE, "")
        if not hmac.compare_digest(given.encode(), expected):
            return JSONResponse(
                {
                    "detail": "this dashboard needs its token: ?token=... or an Authorization "
                    "header (FRUGAL_DASHBOARD_TOKEN)"
                },
                status_code=401,
            )
        response = await call_next(request)
        if from_query:
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    return check


def dashboard_token(host: str) -> tuple[str | None, bool]:
    """The token a bind to `host` needs (None on loopback, unless one is set), and whether
    it was generated here (then it is printed once)."""
    given = os.environ.get("FRUGAL_DASHBOARD_TOKEN")
    if given:
        return given, False
    if is_loopback(host):
        return None, False
    return secrets.token_urlsafe(24), True
