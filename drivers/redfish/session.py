"""The login to one BMC: the service root, TLS verification set up, a session (X-Auth-Token) or HTTP Basic,
logging in again after a drop, logging out.

The login follows the service root (the Redfish standard allows both): a session when the root links a
SessionService, as most BMCs do; HTTP Basic on each request when it does not (OpenStack's sushy-emulator, some
older BMCs). Either way the password goes only over https: a plain-http address is refused before anything is
sent. TLS is always verified, hostname included (drivers/redfish/bmc.py says against what); the library turns
verification off when it is given no CA file, so one is always given.
"""

from __future__ import annotations

import json
import os
import ssl
from typing import Any
from urllib.parse import urlparse

from drivers.audit import AuditSink, record
from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceError, DeviceProtocolError
from drivers.redfish.failures import BmcErrors
from drivers.redfish.http import GuardedAdapter
from drivers.redfish.payload import ROOT, clip, link, path_of
from drivers.redfish.settings import RedfishSettings


class BmcSession:
    """One BMC's login: opened on first use, dropped after a failure, logged out by `logout`."""

    def __init__(self, settings: RedfishSettings, device: str, audit: AuditSink | None, errors: BmcErrors) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address
        self.audit = audit
        self.auth: str | None = None  # "session" or "basic", from the service root at login (`client`)
        self._errors = errors
        self._client: Any = None

    def logout(self) -> None:
        """Log out (a BMC has few session slots; one left open holds a slot until it times out)."""
        client, self._client = self._client, None
        if client is None:
            return
        where = path_of(client.get_session_location() or "")
        try:
            if where:
                record(self.audit, self.device, self.address, "tx", f"DELETE {where} (log out)")
            client.logout()
            if where:
                record(self.audit, self.device, self.address, "rx", "logged out")
        except Exception as exc:  # the BMC went away, or already dropped the session: nothing to free
            record(self.audit, self.device, self.address, "rx", f"(log out failed: {type(exc).__name__})")

    def drop(self) -> None:
        """Forget the client without logging out (its connections are closed; the BMC's session times out)."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client._session.close()  # the library's requests session: its connections, not the BMC's session
            except Exception:
                pass

    def client(self) -> Any:
        """The logged-in client: the service root read and the login done on first use (and after a drop)."""
        if self._client is not None:
            return self._client
        import redfish
        from redfish.rest.v1 import (
            JsonDecodingError,
            RetriesExhaustedError,
            ServerDownOrUnreachableError,
        )

        s = self.settings
        if s.password is None:
            raise self._errors.error(
                DeviceConnectionError,
                "no password for the BMC",
                hint=f"export {s.password_env}=... in the shell that runs testbed"
                if s.password_env
                else "give the driver the BMC password",
            )
        if urlparse(self.address).scheme.lower() != "https":
            # A session login carries the password in its body, HTTP Basic in every request's header: neither goes
            # over plain HTTP (the Redfish standard requires TLS for both). Nothing is sent.
            raise self._errors.error(
                DeviceConnectionError,
                f"the BMC's address {self.address} is plain http: the BMC's password (a session login or HTTP Basic) "
                "is sent only over https",
                sent="(nothing)",
                hint="set bmc.address to the BMC's https address (https://HOST[:PORT]); every Redfish BMC serves "
                "https, and its certificate is verified against bmc.ca_file",
            )
        ca = self._ca_file()
        sent = f"GET {ROOT}/"
        adapter = self._adapter(ca, sent)
        record(self.audit, self.device, self.address, "tx", sent)
        try:
            client = redfish.redfish_client(
                base_url=self.address,
                username=s.user,
                password=s.password,
                cafile=ca,
                timeout=s.timeout_s,
                max_retry=0,
                https_adapter=adapter,
            )
        except RetriesExhaustedError as exc:
            raise self._errors.transport_error(exc, sent, ca) from None
        except ServerDownOrUnreachableError as exc:
            response = getattr(exc, "response", None)
            if response is not None:
                raise self._errors.http_error(response, sent, "read the service root") from None
            raise self._errors.error(
                DeviceConnectionError,
                "the BMC is unreachable",
                sent=sent,
                received=str(exc),
                hint="check bmc.address in the inventory and that the BMC is up",
            ) from None
        except JsonDecodingError as exc:
            raise self._errors.error(
                DeviceProtocolError,
                "the service root is not JSON: this is not a Redfish service",
                sent=sent,
                received=str(exc),
                hint="check bmc.address: it must be the BMC's HTTPS address, where /redfish/v1 is served",
            ) from None
        root = getattr(client, "root", None)
        record(self.audit, self.device, self.address, "rx", f"200 {clip(json.dumps(root))}")
        if not isinstance(root, dict):
            raise self._errors.error(
                DeviceProtocolError,
                "the service root is not a JSON object: this is not a Redfish service",
                sent=sent,
                received=clip(json.dumps(root)),
                hint="check bmc.address: it must be the BMC's HTTPS address, where /redfish/v1 is served",
            )
        self.auth = "session" if has_session_service(root) else "basic"
        if self.auth == "session":
            self._session_login(client, ca)
        else:
            self._basic_login(client, root, ca)
        self._client = client
        return client

    def _adapter(self, ca: str, sent: str) -> GuardedAdapter:
        try:
            return GuardedAdapter(self.address, self.settings.timeout_s, ca)
        except (OSError, ssl.SSLError) as exc:  # not PEM, no certificate in it, unreadable
            raise self._errors.error(
                DeviceConnectionError,
                f"could not use the CA file {ca} to verify the BMC",
                sent=f"(nothing: {sent} needs it)",
                received=str(exc),
                hint="set bmc.ca_file to a readable PEM file holding the CA that signed the BMC's certificate, or "
                "the BMC's certificate itself",
            ) from None

    def _session_login(self, client: Any, ca: str) -> None:
        """POST the service root's Links.Sessions: the BMC has a SessionService."""
        from redfish.messages import RedfishPasswordChangeRequiredError
        from redfish.rest.v1 import InvalidCredentialsError, RetriesExhaustedError, SessionCreationError

        s = self.settings
        login = f"POST {client.login_url} (session login as {s.user!r})"
        record(self.audit, self.device, self.address, "tx", login)
        try:
            client.login(auth="session")
        except InvalidCredentialsError:
            record(self.audit, self.device, self.address, "rx", "401 (login refused)")
            raise self._refused(login) from None
        except RedfishPasswordChangeRequiredError:
            record(self.audit, self.device, self.address, "rx", "(password change required)")
            raise self._errors.error(
                DeviceCommandError,
                f"the BMC wants the password of user {s.user!r} changed before it accepts a login",
                sent=login,
                received="Base.PasswordChangeRequired",
                hint="log in to the BMC once by hand, set a new password, and put it in "
                + (f"${s.password_env}" if s.password_env else "the settings"),
            ) from None
        except SessionCreationError as exc:
            record(self.audit, self.device, self.address, "rx", f"(login failed: {exc})")
            raise self._errors.error(
                DeviceCommandError,
                "the BMC did not open a session",
                sent=login,
                received=str(exc),
                hint=session_hint(str(exc)),
            ) from None
        except RetriesExhaustedError as exc:
            raise self._errors.transport_error(exc, login, ca) from None
        record(self.audit, self.device, self.address, "rx", "session opened")

    def _basic_login(self, client: Any, root: dict, ca: str) -> None:
        """HTTP Basic on every request (the BMC has no SessionService; the address is https, checked above). The
        credentials are tried on the Systems collection, which needs them and is read next anyway.
        """
        from redfish.rest.v1 import InvalidCredentialsError, RetriesExhaustedError

        systems = link(root, "Systems") or f"{ROOT}/Systems"
        client.login_url = systems  # where the library's basic login checks the credentials (a GET)
        login = f"GET {systems} (HTTP Basic as {self.settings.user!r}: the BMC has no SessionService)"
        record(self.audit, self.device, self.address, "tx", login)
        try:
            client.login(auth="basic")
        except InvalidCredentialsError:
            record(self.audit, self.device, self.address, "rx", "401 (login refused)")
            raise self._refused(login) from None
        except RetriesExhaustedError as exc:
            raise self._errors.transport_error(exc, login, ca) from None
        record(self.audit, self.device, self.address, "rx", "credentials accepted")

    def _refused(self, login: str) -> DeviceError:
        s = self.settings
        return self._errors.error(
            DeviceCommandError,
            f"the BMC refused the login of user {s.user!r}",
            sent=login,
            received="HTTP 401 Unauthorized",
            hint=f"check bmc.user in the inventory and the password in ${s.password_env}"
            if s.password_env
            else "check the user and the password",
        )

    def _ca_file(self) -> str:
        ca = self.settings.ca_file
        if ca is None:
            import requests.certs

            return requests.certs.where()  # what requests verifies against by default
        if not os.path.isfile(ca):
            raise self._errors.error(
                DeviceConnectionError,
                f"the BMC's CA file (bmc.ca_file) {ca} does not exist",
                hint="set bmc.ca_file to the PEM file of the CA that signed the BMC's certificate (or of the "
                "certificate itself); verification is never turned off",
            )
        return ca


def has_session_service(root: dict) -> bool:
    """Whether the service root links a SessionService (or, as the standard requires beside it, Links.Sessions):
    then the driver logs in with a session; without one, HTTP Basic is the standard's other way in.
    """
    return bool(link(root, "SessionService") or link(root, "Links", "Sessions"))


def session_hint(failure: str) -> str:
    """What to change when a BMC that has a SessionService did not open a session (the library's text: "HTTP
    STATUS: Failed to create the session\nMESSAGE").
    """
    status = failure.split(":", 1)[0].removeprefix("HTTP ").strip()
    if status == "503" or "SessionLimitExceeded" in failure or "session limit" in failure.lower():
        return (
            "the BMC has no free session slot: log out other clients (or wait for their sessions to time out) "
            "and try again"
        )
    if status in ("404", "405", "501"):
        return (
            "the BMC lists a SessionService but does not take a session login at that address: enable its session "
            "service in the BMC's own settings, or check bmc.address"
        )
    if status == "403":
        return "the user may not log in over Redfish: give it a role with the Login privilege on the BMC"
    if status.startswith("5"):
        return "the BMC failed: try again; if it persists, reset the BMC (not the host) from its own interface"
    return "read the BMC's message above; the login is the one the Redfish standard specifies"
