"""Faults on the connection between the framework and a device (transport.*): Toxiproxy toxics on a proxy in
front of the device's TCP port, and `down` (the proxy refuses new connections and cuts the open ones).

- In an emulated run the twin's fault proxy applies them (a Toxiproxy-compatible proxy in front of each
  device's TCP endpoint, docs/protocols.md §5), through the twin's control.
- On a lab they go through the lab's own Toxiproxy (Shopify's): a device behind one says so in the inventory,
  `fault_proxy: {api: http://HOST:8474, proxy: NAME}`, and its transport's address is the proxy's listen
  address. A toxic is POST /proxies/NAME/toxics, healed by DELETE /proxies/NAME/toxics/TOXIC; `down` is
  POST /proxies/NAME {"enabled": false}, healed by {"enabled": true} (Toxiproxy's README, "HTTP API"). A lab
  run whose plan puts a transport fault on a device without `fault_proxy:` is refused before it starts
  (lab_refusal). `testbed heal` after a crash removes the dead run's toxic by name, or enables the proxy again
  (never POST /reset: it would also clear what others put on that server).

Names and units of the toxics' attributes are Toxiproxy's; TOXICS below is the framework's copy of the proxy's
table (emulators/proxy/toxics.py SCHEMA; a test keeps them equal), so a playbook is validated without the
emulators.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from testbed.faults.base import DeadFault, FaultEnv, FaultFailed, HealLab, Injected, dead_device, twin_control

# toxic type -> its attributes (latency, jitter, delay, timeout in ms; slicer delay in us; rate in KB/s;
# sizes and bytes in bytes). An attribute left out is 0, as in Toxiproxy.
TOXICS: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}
DOWN = "down"  # not a toxic: the proxy refuses new connections and cuts the open ones
FAULT_PROXY_EXAMPLE = 'fault_proxy: {api: "http://HOST:8474", proxy: NAME}'
MAX_ANSWER = 1024 * 1024  # a Toxiproxy answer is a few hundred bytes; more is not a Toxiproxy


@dataclass(frozen=True)
class ConnectionTarget:
    """The connection a transport fault breaks: the device behind the proxy, the toxic's name there (unique
    in the run), which direction, and the toxic's attributes.
    """

    device: str
    toxic: str
    stream: str = "downstream"
    attributes: tuple[tuple[str, int], ...] = ()  # integers, as Toxiproxy decodes them (int64)


# --- a lab's Toxiproxy, through its HTTP API ----------------------------------------------------------------
#
# The standard library's urllib, not a client package: the Python Toxiproxy clients on PyPI are not kept up
# (toxiproxy-python's last release is 0.1.1, January 2019; the Chaos Toolkit extension is a framework's plugin,
# not a client), and what a fault needs of the API is four JSON requests. Proxies from the environment (http_proxy)
# are not used: the Toxiproxy API is on the lab's own network, where a site's HTTP proxy does not lead.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ToxiproxyApi:
    """One device's proxy on a Toxiproxy server: its toxics added and removed, the proxy enabled or not.
    Every failure is a FaultFailed naming the device, the API, what was sent, what came back, what to change.
    """

    def __init__(self, device: str, api: str, proxy: str, timeout_s: float = 5.0) -> None:
        """`api`: the Toxiproxy server's API (http://HOST:8474); `proxy`: the name of the proxy in front of `device`."""
        self.device, self.api, self.proxy, self.timeout_s = device, api.rstrip("/"), proxy, timeout_s

    @classmethod
    def of(cls, inventory: Any, device: str, kind: str) -> ToxiproxyApi:
        """The proxy the inventory puts in front of `device`; FaultFailed saying what to add if none."""
        dev = inventory.devices.get(device) if inventory is not None else None
        config = getattr(dev, "fault_proxy", None)
        if config is None:
            raise FaultFailed(
                f"{kind} on {device}: a lab breaks a device's connection through the Toxiproxy in front of it, and "
                f"the inventory gives {device} none; add {FAULT_PROXY_EXAMPLE} to {device} (docs/inventory.md)"
            )
        return cls(device, config.api, config.proxy, config.timeout_ms / 1000)

    @property
    def _proxy_path(self) -> str:
        return f"/proxies/{quote(self.proxy, safe='')}"

    def add_toxic(self, name: str, toxic_type: str, stream: str, attributes: dict[str, int]) -> dict[str, Any]:
        """Add a toxic to the proxy (toxicity 1: every connection); the toxic as the server shows it."""
        body = {"name": name, "type": toxic_type, "stream": stream, "toxicity": 1.0, "attributes": attributes}
        status, answer = self.request("POST", f"{self._proxy_path}/toxics", body)
        if status == 404:
            raise self._no_proxy("POST", f"{self._proxy_path}/toxics", body, answer)
        self._expect_ok(status, answer, "POST", f"{self._proxy_path}/toxics", body)
        toxic = self._object(answer, ("name", "type"), "POST", f"{self._proxy_path}/toxics", body)
        if toxic["name"] != name or toxic["type"] != toxic_type:
            raise self._failed(
                "POST",
                f"{self._proxy_path}/toxics",
                body,
                f"HTTP {status} with toxic {toxic['name']!r} of type {toxic['type']!r}",
                "this server is not applying toxics as Toxiproxy does; check that api: is a Toxiproxy's API",
            )
        return toxic

    def remove_toxic(self, name: str) -> bool:
        """True if the toxic was there and is gone, False if it was already gone (the proxy is there)."""
        path = f"{self._proxy_path}/toxics/{quote(name, safe='')}"
        status, answer = self.request("DELETE", path)
        if status == 404:
            self.state()  # the proxy itself there (or a FaultFailed saying it is not): only the toxic is gone
            return False
        self._expect_ok(status, answer, "DELETE", path)
        return True

    def set_enabled(self, enabled: bool) -> dict[str, Any]:
        """Enable the proxy, or disable it (it refuses new connections and cuts the open ones); the proxy as the
        server shows it.
        """
        body = {"enabled": enabled}
        status, answer = self.request("POST", self._proxy_path, body)
        if status == 404:
            raise self._no_proxy("POST", self._proxy_path, body, answer)
        self._expect_ok(status, answer, "POST", self._proxy_path, body)
        proxy = self._object(answer, ("name", "enabled"), "POST", self._proxy_path, body)
        if proxy["enabled"] is not enabled:
            raise self._failed(
                "POST",
                self._proxy_path,
                body,
                f"HTTP {status} with the proxy's enabled {proxy['enabled']!r}, not {enabled}",
                "the proxy did not change; look at the Toxiproxy server's log",
            )
        return proxy

    def state(self) -> dict[str, Any]:
        """The proxy as the server shows it ({name, listen, upstream, enabled, toxics})."""
        status, answer = self.request("GET", self._proxy_path)
        if status == 404:
            raise self._no_proxy("GET", self._proxy_path, None, answer)
        self._expect_ok(status, answer, "GET", self._proxy_path)
        proxy = self._object(answer, ("name", "enabled"), "GET", self._proxy_path)
        if not isinstance(proxy.get("toxics", []), list):
            raise self._failed("GET", self._proxy_path, None, f"toxics {proxy['toxics']!r}", _NOT_TOXIPROXY)
        return proxy

    # --- HTTP -------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """(status, parsed JSON answer or None for an empty one); FaultFailed if no HTTP answer came back or
        its body is not JSON.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            try:
                with _OPENER.open(req, timeout=self.timeout_s) as resp:
                    status, raw = resp.status, resp.read(MAX_ANSWER + 1)
            except urllib.error.HTTPError as exc:  # an HTTP answer all the same: 4xx / 5xx
                try:
                    status, raw = exc.code, (exc.read(MAX_ANSWER + 1) if exc.fp is not None else b"")
                finally:
                    exc.close()
        except urllib.error.URLError as exc:
            raise self._failed(
                method,
                path,
                body,
                f"no answer: {exc.reason}",
                "check that Toxiproxy runs there and that this machine reaches it (fault_proxy.api)",
            ) from None
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            why = f"no answer within {self.timeout_s:g} s" if isinstance(exc, TimeoutError) else _describe(exc)
            raise self._failed(method, path, body, why, _NOT_TOXIPROXY) from None
        if len(raw) > MAX_ANSWER:
            raise self._failed(method, path, body, f"HTTP {status} with over {MAX_ANSWER} bytes", _NOT_TOXIPROXY)
        if not raw.strip():
            return status, None
        try:
            return status, json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise self._failed(
                method, path, body, f"HTTP {status} {_excerpt(raw)} (not JSON)", _NOT_TOXIPROXY
            ) from None

    def _expect_ok(self, status: int, answer: Any, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        if not 200 <= status < 300:
            error = answer.get("error") if isinstance(answer, dict) else None
            shown = (
                f": {error}"
                if error
                else " (no body)"
                if answer is None
                else f" {_excerpt(json.dumps(answer).encode())}"
            )
            change = (
                "the Toxiproxy server failed; look at its log"
                if status >= 500
                else "the server refused it; check the fault's attributes and stream, and the proxy (fault_proxy.proxy)"
            )
            raise self._failed(method, path, body, f"HTTP {status}{shown}", change)

    def _object(
        self, answer: Any, keys: tuple[str, ...], method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        if not isinstance(answer, dict) or any(k not in answer for k in keys):
            got = _excerpt(json.dumps(answer).encode())
            raise self._failed(method, path, body, f"{got}, not an object with {', '.join(keys)}", _NOT_TOXIPROXY)
        return answer

    def _no_proxy(self, method: str, path: str, body: dict[str, Any] | None, answer: Any) -> FaultFailed:
        error = answer.get("error") if isinstance(answer, dict) else None
        names = ""
        try:
            status, proxies = self.request("GET", "/proxies")
            if status == 200 and isinstance(proxies, dict):
                names = f" (its proxies: {', '.join(sorted(map(str, proxies))) or 'none'})"
        except FaultFailed:
            pass  # the list is a hint only
        return self._failed(
            method,
            path,
            body,
            f"HTTP 404{': ' + error if error else ''}",
            f"there is no proxy {self.proxy!r} on that server{names}; set fault_proxy.proxy of {self.device} to the "
            "name of the proxy in front of it",
        )

    def _failed(self, method: str, path: str, body: dict[str, Any] | None, got: str, change: str) -> FaultFailed:
        sent = f"{method} {self.api}{path}" + (f" {json.dumps(body)}" if body is not None else "")
        return FaultFailed(f"{self.device}: the Toxiproxy API at {self.api}: sent {sent}; got {got}; {change}")


_NOT_TOXIPROXY = "this is not a Toxiproxy API answer; check that fault_proxy.api is the Toxiproxy API (port 8474)"


def _excerpt(raw: bytes) -> str:
    text = raw[:200].decode("utf-8", "replace")
    return repr(text) + ("..." if len(raw) > 200 else "")


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- the kinds ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransportFault:
    """A fault on a device's connection: a Toxiproxy toxic (`toxic`, a key of TOXICS) or the proxy down (DOWN)."""

    name: str
    toxic: str  # a key of TOXICS, or DOWN
    target: str = "connection"
    lab_support: str | None = None  # through the lab's Toxiproxy in front of the device: lab_refusal says where not

    @property
    def attributes(self) -> tuple[str, ...]:
        """The toxic's attributes a playbook may set (none for `down`)."""
        return TOXICS.get(self.toxic, ())

    def lab_refusal(self, inventory: Any, devices: list[str]) -> str | None:
        """Why a lab run that puts this fault on `devices` cannot (None: it can): a device without a Toxiproxy
        (`fault_proxy:`) in front of it in the inventory.
        """
        missing = [d for d in devices if getattr(inventory.devices.get(d), "fault_proxy", None) is None]
        if not missing:
            return None
        these = ", ".join(missing)
        return (
            f"a lab breaks a device's connection through the Toxiproxy in front of it, and the inventory gives "
            f"{these} none; add {FAULT_PROXY_EXAMPLE} to {'each of them' if len(missing) > 1 else these} "
            "(the Toxiproxy API and the proxy's name there; the transport's address is the proxy's listen address: "
            "docs/inventory.md)"
        )

    def inject(self, env: FaultEnv, target: ConnectionTarget) -> Injected:
        """Add the toxic (or disable the proxy) through the twin's fault proxy, or the lab's Toxiproxy API."""
        t0 = time.monotonic_ns()
        if env.twin is None:
            api = ToxiproxyApi.of(env.inventory, target.device, self.name)
            t0 = time.monotonic_ns()
            if self.toxic == DOWN:
                api.set_enabled(False)
            else:
                api.add_toxic(target.toxic, self.toxic, target.stream, dict(target.attributes))
            return Injected((t0 + time.monotonic_ns()) // 2)  # within the request that applied it
        try:
            if self.toxic == DOWN:
                env.twin.call(target.device, "proxy.set_enabled", enabled=False)
            else:
                env.twin.call(
                    target.device,
                    "proxy.add_toxic",
                    name=target.toxic,
                    type=self.toxic,
                    stream=target.stream,
                    attributes=dict(target.attributes),
                )
        except Exception as exc:  # the twin refused (no proxy, bad attribute) or is gone: nothing was applied
            raise FaultFailed(f"the twin's fault proxy refused {self.name}: {exc}") from None
        return Injected((t0 + time.monotonic_ns()) // 2)  # within the call that applied it

    def heal(self, env: FaultEnv, target: ConnectionTarget) -> None:
        """Remove the toxic (or enable the proxy again), where inject put it."""
        if env.twin is None:
            api = ToxiproxyApi.of(env.inventory, target.device, self.name)
            if self.toxic == DOWN:
                api.set_enabled(True)
            else:
                api.remove_toxic(target.toxic)
            return
        try:
            if self.toxic == DOWN:
                env.twin.call(target.device, "proxy.set_enabled", enabled=True)
            else:
                env.twin.call(target.device, "proxy.remove_toxic", name=target.toxic)
        except Exception as exc:
            raise FaultFailed(f"could not heal {self.name} on {target.device}: {exc}") from None

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        """Reset the twin's fault proxy of the device, or remove the dead run's toxic by name (enable its proxy
        again) through the lab's Toxiproxy API.
        """
        device = dead_device(fault, fault.data.get("device"))
        if lab.control is not None or getattr(lab, "inventory", None) is None:
            twin_control(lab, fault).call(device, "proxy.reset")
            return f"twin control proxy.reset on {device}"
        api = ToxiproxyApi.of(lab.inventory, device, self.name)
        if self.toxic == DOWN:
            api.set_enabled(True)
            return f"proxy {api.proxy} enabled again through the Toxiproxy API at {api.api}"
        toxic = fault.data.get("toxic")
        if not toxic:
            raise FaultFailed(
                f"{fault.name}: the dead run did not record the toxic's name; list the toxics with "
                f"GET {api.api}/proxies/{api.proxy}/toxics and DELETE the run's"
            )
        if api.remove_toxic(toxic):
            return f"toxic {toxic} removed from proxy {api.proxy} through the Toxiproxy API at {api.api}"
        return f"toxic {toxic} was already gone from proxy {api.proxy} (Toxiproxy API at {api.api})"


TRANSPORT_FAULTS = tuple(TransportFault(f"transport.{toxic}", toxic) for toxic in (*TOXICS, DOWN))
