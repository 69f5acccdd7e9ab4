"""Where budget alerts go besides the console: a webhook and e-mail, each configured only by
environment variables, so that no secret is ever written to a file or a log.

    FRUGAL_ALERT_WEBHOOK   URL that receives a JSON POST per alert ({"text": ..., "alert": {...}};
                           Slack and Mattermost incoming webhooks show "text")
    FRUGAL_SMTP_HOST       SMTP server; with FRUGAL_ALERT_EMAIL_TO (comma-separated) and
    FRUGAL_SMTP_PORT       (default 587 with STARTTLS, 25 with FRUGAL_SMTP_STARTTLS=0),
    FRUGAL_SMTP_USER, FRUGAL_SMTP_PASSWORD (optional login), FRUGAL_ALERT_EMAIL_FROM

A delivery that fails is reported (without the URL's or the server's credentials) and
never stops a run.
"""

from __future__ import annotations

import json
import os
import smtplib
import urllib.request
from collections.abc import Callable
from email.message import EmailMessage
from urllib.parse import urlsplit

from frugal.ledger.budgets import AlertEvent

TIMEOUT_S = 10.0


def deliver(events: list[AlertEvent]) -> list[str]:
    """Send `events` to the webhook and by e-mail where configured; returns one line per
    failed delivery."""
    problems: list[str] = []
    if not events:
        return problems
    url = os.environ.get("FRUGAL_ALERT_WEBHOOK")
    if url:
        for e in events:
            try:
                _post(url, {"text": f"frugal: {e.message}", "alert": e.to_json()})
            except Exception as err:  # whatever goes wrong, a run goes on
                problems.append(f"alert webhook {_safe(url)} failed: {_why(err)}")
                break
    if os.environ.get("FRUGAL_SMTP_HOST") and os.environ.get("FRUGAL_ALERT_EMAIL_TO"):
        try:
            _mail(events)
        except Exception as err:  # a bad port, a refused login, a server away
            problems.append(
                f"alert e-mail via {os.environ['FRUGAL_SMTP_HOST']} failed: {_why(err)}"
            )
    return problems


def announce(events: list[AlertEvent], say: Callable[[str], None]) -> None:
    """Alerts to the console (`say`), then to the webhook and e-mail where configured."""
    for e in events:
        say(f"[bold yellow]budget alert:[/] {e.message}")
    for problem in deliver(events):
        say(f"[yellow]{problem}[/]")


def _post(url: str, body: dict[str, object]) -> None:
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError("FRUGAL_ALERT_WEBHOOK must be an http(s) URL")
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        resp.read()


def _mail(events: list[AlertEvent]) -> None:
    env = os.environ
    starttls = env.get("FRUGAL_SMTP_STARTTLS", "1") != "0"
    port = int(env.get("FRUGAL_SMTP_PORT") or (587 if starttls else 25))
    msg = EmailMessage()
    first = events[0]
    more = f" (+{len(events) - 1} more)" if len(events) > 1 else ""
    msg["Subject"] = f"frugal budget alert: {first.budget} at {first.threshold_pct:g}%{more}"
    msg["From"] = env.get("FRUGAL_ALERT_EMAIL_FROM", "frugal@localhost")
    msg["To"] = env["FRUGAL_ALERT_EMAIL_TO"]
    msg.set_content("\n".join(e.message for e in events) + "\n")
    with smtplib.SMTP(env["FRUGAL_SMTP_HOST"], port, timeout=TIMEOUT_S) as smtp:
        if starttls:
            smtp.starttls()
        if env.get("FRUGAL_SMTP_USER"):
            smtp.login(env["FRUGAL_SMTP_USER"], env.get("FRUGAL_SMTP_PASSWORD", ""))
        smtp.send_message(msg)


def _safe(url: str) -> str:
    """The URL's host only: webhook URLs carry their secret in the path."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" if parts.hostname else "(unparsable URL)"


def _why(err: BaseException) -> str:
    return str(getattr(err, "reason", None) or err).splitlines()[0][:200] or type(err).__name__
