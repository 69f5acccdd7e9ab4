"""`frugal dashboard`: the books in a browser (frugal.web), on loopback unless told."""

from __future__ import annotations

import socket

import typer

from frugal.cli.options import number
from frugal.errors import FrugalError


def dashboard(
    host: str = typer.Option(
        "127.0.0.1", help="Address to serve on; any but loopback requires the token."
    ),
    port: int = number(8050, "TCP port.", ge=1, le=65535, whole=True),
    db: str | None = typer.Option(None, help="Ledger URL [default: FRUGAL_DB_URL, else frugal's]."),
) -> None:
    """Serve the dashboard and its JSON API (/api/docs) over the ledger."""
    try:
        import uvicorn

        from frugal.web.app import create_app, dashboard_token
    except ImportError:
        raise FrugalError(
            "frugal dashboard needs its extra: pip install 'frugal-ft[dashboard]'"
        ) from None
    if db is not None:
        from frugal.ledger.db import existing

        existing(db, "--db")
    _check_free(host, port)
    token, generated = dashboard_token(host)
    app = create_app(db, token)  # opens the ledger: a bad URL fails here, in one line
    where = f"http://{'localhost' if host in ('127.0.0.1', '::1') else host}:{port}"
    if generated:
        print(f"token (shown once; or set FRUGAL_DASHBOARD_TOKEN): {token}")
    print(f"frugal dashboard: {where}/api/docs{f'?token={token}' if generated else ''}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _check_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise FrugalError(
                f"cannot serve on {host}:{port} ({e.strerror}): choose another --port or --host"
            ) from None
