"""A webhook: a JSON body POSTed to a URL the lab gives, when a run of `testbed serve` ends (`--webhook URL`) or a
`testbed gate` fails (docs/serve.md, docs/catalog.md).

A webhook tells; it never decides. Each call is made from a thread of its own, one after another, each bounded by
WEBHOOK_TIMEOUT_S, so a receiver that hangs or fails neither blocks nor fails a run, and a run's end is never
waited on. A call that fails is logged with the URL (its secrets redacted), what came back and what to change.
https is verified against the machine's trusted certificates; a redirect is not followed (a POST's body would be
resent, maybe in the clear): it is logged, naming where it pointed.
"""

from __future__ import annotations

import base64
import json
import queue
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.contracts.errors import UserError

WEBHOOK_TIMEOUT_S = 10.0  # a call's bound: connecting, sending, and each wait for the receiver's answer
MAX_PENDING = 100  # calls waiting behind a slow receiver; past that, a call is dropped (and said)
MAX_SPANS = 50  # a run's headline figures: its spans' summaries, at most this many


def redact(url: str) -> str:
    """The URL as it may be printed: its user and password, query values and fragment replaced by ***."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(
        f"{name}=***" if value or eq else name
        for name, eq, value in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, "***" if parts.fragment else ""))


def check_url(url: str, option: str = "--webhook") -> str:
    """The URL if it can be called (http or https, with a host); UserError saying what to give otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise UserError(f"{option} {redact(url)}: not a URL ({exc}); give http(s)://HOST[:PORT]/PATH") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"{option} {redact(url)}: give an http:// or https:// URL with a host, e.g. https://ci.lab/hook"
        )
    return url


class Webhook:
    """POSTs JSON bodies to `url` from a thread, in order. `say(line)` logs (a failed call, a dropped one)."""

    def __init__(self, url: str, say: Callable[[str], None], timeout_s: float = WEBHOOK_TIMEOUT_S) -> None:
        self.url = check_url(url)
        self.shown = redact(url)
        self.say = say
        self.timeout_s = timeout_s
        self._pending: queue.Queue[tuple[str, dict | Callable[[], dict]] | None] = queue.Queue(MAX_PENDING)
        self._thread = threading.Thread(target=self._send_all, name="testbed-webhook", daemon=True)
        self._thread.start()

    def post(self, what: str, body: dict | Callable[[], dict]) -> None:
        """Queue a call (`what` names it in the log); never waits: a full queue drops it, saying so. `body` may be
        a function that makes it, called in the webhook's thread (reading a file there, not in the caller's).
        """
        try:
            self._pending.put_nowait((what, body))
        except queue.Full:
            self.say(
                f"webhook {self.shown}: {what} not sent: {MAX_PENDING} calls are already waiting for a receiver "
                "that answers slowly or not at all; check it, or change the webhook's URL"
            )

    def close(self, wait_s: float | None = None) -> int:
        """Let the calls queued so far be made, waiting at most `wait_s` (default: one call's bound) -> how many were
        not made by then (0: all were); one still waiting on its receiver is left to the thread, which dies with the
        process.
        """
        deadline = time.monotonic() + (wait_s if wait_s is not None else self.timeout_s + 1.0)
        try:
            self._pending.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            return MAX_PENDING + 1
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return self._pending.qsize() + 1 if self._thread.is_alive() else 0  # the calls left, and the one under way

    def _send_all(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            what, body = item
            try:
                failure = self._send(body() if callable(body) else body)
            except Exception as exc:  # noqa: BLE001 - a body that could not be made is said, the next calls made
                failure = f"its body could not be made ({type(exc).__name__}: {exc})"
            if failure is not None:
                self.say(f"webhook {self.shown}: {what} not delivered: {failure}")

    def _send(self, body: dict) -> str | None:
        """One POST -> None when the receiver took it (2xx), else what went wrong and what to change."""
        parts = urllib.parse.urlsplit(self.url)
        headers = {"Content-Type": "application/json", "User-Agent": "testbed-webhook"}
        url = self.url
        if parts.username is not None:  # user:password@ becomes Basic authorization, never part of what is logged
            login = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(login.encode()).decode()
            url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        data = json.dumps(body, default=str).encode()
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        opener = urllib.request.build_opener(
            _NoRedirect, urllib.request.HTTPSHandler(context=ssl.create_default_context())
        )
        try:
            with opener.open(request, timeout=self.timeout_s) as answer:
                answer.read(64 << 10)
            return None
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = redact(exc.headers.get("Location") or "?")
                return f"answered {exc.code} (a redirect to {where}, not followed): give that URL to --webhook"
            return (
                f"answered {exc.code} {exc.reason}: the receiver refused or failed the call; see its log, or change "
                "the URL given to --webhook"
            )
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                return (
                    f"its certificate is not trusted ({reason.verify_message}): give the receiver a certificate "
                    "that chains to a CA this machine trusts (SSL_CERT_FILE names another bundle)"
                )
            if isinstance(reason, TimeoutError):
                return self._timed_out()
            return f"cannot reach it ({reason}): check the host and port of --webhook, and that the receiver runs"
        except TimeoutError:
            return self._timed_out()
        except OSError as exc:  # the connection reset mid-answer, and the like
            return f"the call failed ({exc}): check the receiver, or change --webhook"

    def _timed_out(self) -> str:
        return (
            f"no answer within {self.timeout_s:g} s: the receiver hangs or is slow; it should answer at once (and "
            "work afterwards), or change --webhook"
        )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx is raised as an HTTPError, and logged


def run_ended(run: dict, server: dict) -> dict[str, Any]:
    """The body POSTed when a run of the server ends: the run as GET /runs/{id} describes it, the server it ran
    on, and the run's headline figures (its trials and its spans' summaries, from its summary.json) when it has
    them.
    """
    keys = ("id", "user", "playbook", "status", "run_dir", "error", "submitted", "started", "ended", "tags")
    return {
        "event": "run.ended",
        **{key: run.get(key) for key in keys},
        "server": {key: server.get(key) for key in ("inventory", "emulate", "results")},
        "figures": _figures(run.get("run_dir")),
    }


def _figures(run_dir: str | None) -> dict | None:
    """A run's trials and its spans' summaries (median, p95, ... in ms), as its summary.json has them; None for a
    run without one (cancelled before it started, or stopped before its end was written).
    """
    from testbed.events.safe_files import read_bytes

    if not run_dir:
        return None
    try:
        summary = json.loads(read_bytes(Path(run_dir) / "summary.json", 1 << 20))
    except (OSError, UserError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    spans = summary.get("spans")
    if not isinstance(spans, dict):
        spans = {}
    return {"trials": summary.get("trials"), "spans": dict(list(spans.items())[:MAX_SPANS])}


def gate_failed(args, result: dict) -> dict[str, Any]:
    """The body POSTed when `testbed gate` fails: the selections, the limit, and each comparison found slower with
    its figures (the medians, the ratio, its 95 % interval, the adjusted p-value, the runs on each side).
    """
    keys = (
        "span", "playbook", "point", "label", "ratio", "interval", "p_holm", "baseline_median", "candidate_median",
        "baseline_n", "candidate_n", "baseline_runs", "candidate_runs",
    )  # fmt: skip
    from testbed.catalog.gate import SLOWER

    slower = [c for c in result["comparisons"] if c.get("verdict") == SLOWER]
    return {
        "event": "gate.failed",
        "spans": list(args.spans),
        "baseline": args.baseline or [],
        "against_trend": bool(args.against_trend),
        "candidate": args.candidate,
        "max_slowdown_pct": result["max_slowdown_pct"],
        "limit": result["limit"],
        "failed": result["failed"],
        "failed_points": result["failed_points"],
        "slower": [{key: c.get(key) for key in keys} for c in slower],
        "comparisons": len(result["comparisons"]),
    }


# The server's OpenAPI document describes the call (OpenAPI 3.1 `webhooks`; testbed.serve.api).
WEBHOOKS = {
    "runEnded": {
        "post": {
            "summary": "testbed serve --webhook URL: a run ended (ok, failed, aborted, cancelled or refused)",
            "requestBody": {
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "event": {"const": "run.ended"},
                                "id": {"type": "string"},
                                "user": {"type": "string"},
                                "playbook": {"type": "string"},
                                "status": {"enum": ["ok", "failed", "aborted", "cancelled", "refused"]},
                                "run_dir": {"type": ["string", "null"]},
                                "error": {"type": ["string", "null"]},
                                "submitted": {"type": "number"},
                                "started": {"type": ["number", "null"]},
                                "ended": {"type": "number"},
                                "tags": {"type": "array", "items": {"type": "string"}},
                                "server": {"type": "object", "description": "inventory, emulate, results"},
                                "figures": {
                                    "type": ["object", "null"],
                                    "description": "the run's trials (planned, ok, failed) and its spans' summaries "
                                    "in ms (summary.json); null for a run without them",
                                },
                            },
                        }
                    }
                }
            },
            "responses": {"200": {"description": "any 2xx: taken; anything else is logged by the server"}},
        }
    }
}
