"""The errors of one BMC: what a refused request, a failed TLS handshake, a deadline or a dead network mean, each
as a drivers.errors.DeviceError naming the host, the BMC's address, what was sent and what to try.
"""

from __future__ import annotations

from typing import Any, TypeVar

from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.redfish.http import BodyTooLarge, DeadlineExceeded, RedirectRefused
from drivers.redfish.payload import clip, json_of, text_of
from drivers.redfish.settings import RedfishSettings

E = TypeVar("E", bound=DeviceError)


class BmcErrors:
    """Builds the device errors of one host's BMC, with what to try for each failure."""

    def __init__(self, settings: RedfishSettings, device: str) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address

    def error(self, cls: type[E], message: str, **kw: Any) -> E:
        """A device error of this BMC: `kw` says what was sent and received, and what to try."""
        return cls(message, device=self.device, address=self.address, **kw)

    def http_error(self, resp: Any, sent: str, what: str) -> DeviceError:
        """A request the BMC answered with an error: its status and its Redfish messages (MessageId, Message),
        and what to change (the BMC's Resolution if it gave one).
        """
        messages, resolutions = _extended_info(resp)
        received = f"HTTP {resp.status}" + (": " + " | ".join(messages) if messages else f": {clip(text_of(resp))}")
        if resolutions:
            hint = " ".join(dict.fromkeys(resolutions))
        elif resp.status in (401, 403):
            env = self.settings.password_env
            hint = (
                f"check bmc.user and the password in ${env}, and that user {self.settings.user!r} may "
                "reset the system on the BMC (its role needs ConfigureComponents)"
                if env
                else "check the user, the password and the user's role on the BMC"
            )
        elif resp.status == 404:
            hint = "check bmc.address and bmc.system in the inventory"
        elif resp.status >= 500:
            hint = "the BMC failed: try again; if it persists, reset the BMC (not the host) from its own interface"
        else:
            hint = "read the BMC's message above; the request is what the Redfish standard specifies"
        cls = DeviceProtocolError if resp.status >= 500 else DeviceCommandError
        return self.error(cls, f"the BMC answered HTTP {resp.status} ({what})", sent=sent, received=received, hint=hint)

    def transport_error(self, exc: Exception, sent: str, ca: str | None) -> DeviceError:
        """A request that got no answer (the library's RetriesExhaustedError): why, from the cause it wraps."""
        import requests

        cause = exc.__cause__ or exc
        if isinstance(cause, RedirectRefused):
            return self.error(
                DeviceProtocolError,
                f"the BMC redirected the request to {cause.target}, another origin or plain HTTP: not followed, and "
                "the session's token was not sent there",
                sent=sent,
                received=f"a redirect to {cause.target}",
                hint="set bmc.address to the BMC's own https address (the one it redirects to, if that is the BMC), "
                "or check who answers at this address",
            )
        if isinstance(cause, DeadlineExceeded):
            return self.error(
                DeviceTimeout,
                f"no whole answer within {cause.seconds:g} s (the BMC answered too slowly, or not at all)",
                sent=sent,
                received="the connection was shut at the deadline",
                hint="raise bmc.timeout_ms for a slow BMC; a BMC that answers a byte at a time is not well",
            )
        if isinstance(cause, BodyTooLarge):
            return self.error(
                DeviceProtocolError,
                f"the BMC's answer is larger than {cause.limit} bytes, far more than a Redfish resource",
                sent=sent,
                received=f"more than {cause.limit} bytes (not read further)",
                hint="check bmc.address: it must be the BMC's Redfish service",
            )
        if _timed_out(cause):
            return self.error(
                DeviceTimeout,
                f"no answer within {self.settings.timeout_s:g} s",
                sent=sent,
                received=_reason(cause),
                hint="check that bmc.address is the BMC's (its management network is reachable from this "
                "machine); raise bmc.timeout_ms for a slow BMC",
            )
        if isinstance(cause, requests.exceptions.SSLError):
            against = (
                f"bmc.ca_file {self.settings.ca_file}" if self.settings.ca_file else "the default CA bundle (certifi's)"
            )
            return self.error(
                DeviceConnectionError,
                f"the BMC's TLS certificate did not verify against {against}",
                sent=sent,
                received=_reason(cause),
                hint="set bmc.ca_file in the inventory to the PEM file of the CA that signed the BMC's certificate "
                "(or of the certificate itself, to pin it); verification is never turned off",
            )
        if isinstance(cause, OSError) and not isinstance(cause, requests.exceptions.RequestException):
            return self.error(
                DeviceConnectionError,
                f"could not use the CA file {ca} to verify the BMC",
                sent=sent,
                received=str(cause),
                hint="set bmc.ca_file to a readable PEM file",
            )
        return self.error(
            DeviceConnectionError,
            "could not reach the BMC",
            sent=sent,
            received=_reason(cause),
            hint="check bmc.address in the inventory (https://HOST[:PORT]) and that this machine reaches the "
            "BMC's management network",
        )


def _timed_out(exc: BaseException) -> bool:
    """Whether a read or a connection timed out, wherever requests put it (a body read that times out is raised as
    a ConnectionError around urllib3's ReadTimeoutError).
    """
    import socket

    import requests
    from urllib3.exceptions import NewConnectionError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, NewConnectionError):  # a refused connection (urllib3 files it under connect timeouts)
            return False
        if isinstance(current, requests.exceptions.Timeout | Urllib3Timeout | socket.timeout):
            return True
        nested = current.__cause__ or current.__context__ or (current.args[0] if current.args else None)
        current = nested if isinstance(nested, BaseException) else None
    return False


def _extended_info(resp: Any) -> tuple[list[str], list[str]]:
    body = json_of(resp)
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return [], []
    infos = err.get("@Message.ExtendedInfo")
    messages, resolutions = [], []
    for info in infos if isinstance(infos, list) else []:
        if isinstance(info, dict):
            messages.append(f"{info.get('MessageId', '?')}: {info.get('Message', '')}".strip())
            if isinstance(info.get("Resolution"), str) and info["Resolution"] not in ("", "None", "None."):
                resolutions.append(info["Resolution"])
    if not messages and isinstance(err.get("message"), str):
        messages.append(f"{err.get('code', '?')}: {err['message']}")
    return messages, resolutions


def _reason(exc: BaseException) -> str:
    """The innermost cause's text: what urllib3 and ssl said, without requests' wrapping."""
    while exc.__cause__ is not None or (exc.args and isinstance(exc.args[0], BaseException)):
        nested = exc.__cause__ or exc.args[0]
        if nested is exc:
            break
        exc = nested
    return str(exc)
