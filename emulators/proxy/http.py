"""ProxyServer: Toxiproxy's HTTP API shape over FaultProxy, so Toxiproxy clients can drive it.

A minimal HTTP/1.1 server on 127.0.0.1 (keep-alive, Content-Length bodies only, JSON in and out).
Routes, status codes, request types and error bodies ({"error": ..., "status": ...}, Toxiproxy's texts) follow
Toxiproxy 2.x's server (read from its source: docs/protocols.md §5.2 says what is reproduced and what not):

    GET    /proxies                      200 {name: proxy}
    POST   /proxies                      201 proxy     {name, listen, upstream, enabled}; 409 if it exists
    GET    /proxies/{p}                  200 proxy
    POST   /proxies/{p}  (or PATCH)      200 proxy     {enabled, listen, upstream}, each optional
    DELETE /proxies/{p}                  204
    GET    /proxies/{p}/toxics           200 [toxic]
    POST   /proxies/{p}/toxics           200 toxic     {name, type, stream, toxicity, attributes}
    GET    /proxies/{p}/toxics/{t}       200 toxic
    POST   /proxies/{p}/toxics/{t}       200 toxic     {toxicity, attributes} (update; or PATCH)
    DELETE /proxies/{p}/toxics/{t}       204
    POST   /reset                        204           every proxy: toxics removed, enabled
    GET    /version                      200

Bodies are decoded as Toxiproxy's Go server decodes them (gojson.py): a float where it takes an integer is
400 with Go's message. Malformed HTTP gets 400 and the connection is closed; unknown routes 404; a known route
with another method 405. `listen` must be a loopback address (port 0 = ephemeral); anything else is 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import unquote

from emulators.proxy import gojson
from emulators.proxy.core import FaultProxy, check_loopback, parse_hostport
from emulators.proxy.toxics import SCHEMA, STREAMS, ConflictError, NotFoundError, make_toxic

MAX_HEADER = 16 * 1024
MAX_BODY = 1024 * 1024
IDLE_TIMEOUT = 60.0
VERSION = "testbed-faultproxy-1"
_REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    500: "Internal Server Error",
}


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class ProxyServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, seed: int = 0):
        check_loopback(host)
        self.host = host
        self.port = port
        self.seed = seed
        self.proxies: dict[str, FaultProxy] = {}
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._client, self.host, self.port, limit=MAX_HEADER)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.address

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._clients):
            writer.transport.abort()
        for proxy in list(self.proxies.values()):
            await proxy.close()
        self.proxies.clear()

    # --- HTTP ------------------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        try:
            keep_alive = True
            while keep_alive:
                try:
                    method, target, headers, body, keep_alive = await asyncio.wait_for(
                        self._read_request(reader), IDLE_TIMEOUT
                    )
                except HttpError as exc:
                    await self._respond(writer, exc.status, {"error": exc.message, "status": exc.status}, False)
                    return
                except (TimeoutError, asyncio.IncompleteReadError):
                    return  # the client went away (or idled out) between or inside requests
                status, payload = await self.handle(method, target, body, headers)
                await self._respond(writer, status, payload, keep_alive)
        except Exception:  # noqa: S110 - a broken client connection must never reach the loop
            pass
        finally:
            self._clients.discard(writer)
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes, bool]:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise HttpError(400, f"request head longer than {MAX_HEADER} bytes") from None
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                raise HttpError(400, "incomplete request head") from None
            raise
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
            raise HttpError(400, "undecodable request head") from None
        lines = text.split("\r\n")
        while lines and not lines[0]:
            lines.pop(0)  # tolerate blank lines before a request (RFC 9112 2.2)
        if not lines:
            raise HttpError(400, "empty request")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
            raise HttpError(400, f"malformed request line {lines[0][:100]!r}")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise HttpError(400, f"unsupported HTTP version {version[:20]!r}")
        if not target.startswith("/"):
            raise HttpError(400, f"request target must be a path, got {target[:100]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or not name.isascii():
                raise HttpError(400, f"malformed header line {line[:100]!r}")
            headers[name.lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise HttpError(400, "Transfer-Encoding is not supported; send Content-Length")
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit() or not length_text.isascii():
            raise HttpError(400, f"bad Content-Length {length_text[:30]!r}")
        length = int(length_text)
        if length > MAX_BODY:
            raise HttpError(413, f"body longer than {MAX_BODY} bytes")
        body = await reader.readexactly(length) if length else b""
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        return method, target, headers, body, keep_alive

    async def _respond(self, writer: asyncio.StreamWriter, status: int, payload: Any, keep_alive: bool) -> None:
        body = b"" if status == 204 else json.dumps(payload).encode() + b"\n"
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}"]
        if status != 204:
            # Toxiproxy answers errors through Go's http.Error: the JSON error object as text/plain.
            kind = "application/json" if status < 400 else "text/plain; charset=utf-8"
            head += [f"Content-Type: {kind}", f"Content-Length: {len(body)}"]
        head.append("Connection: keep-alive" if keep_alive else "Connection: close")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()

    # --- routes ----------------------------------------------------------------------------------

    async def handle(
        self, method: str, target: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """One request -> (status, JSON payload); never raises."""
        try:
            if (headers or {}).get("user-agent", "").startswith("Mozilla/"):
                raise HttpError(403, "User agent not allowed")  # Toxiproxy turns browsers away (no CSRF guard)
            return await self._route(method, target, body)
        except gojson.DecodeError as exc:
            return 400, {"error": str(exc), "status": 400}
        except HttpError as exc:
            return exc.status, {"error": exc.message, "status": exc.status}
        except NotFoundError as exc:
            return 404, {"error": str(exc), "status": 404}
        except ConflictError as exc:
            return 409, {"error": str(exc), "status": 409}
        except ValueError as exc:
            return 400, {"error": str(exc), "status": 400}
        except OSError as exc:  # e.g. the listen port is taken (Toxiproxy: 500 with the listen error)
            return 409, {"error": f"cannot listen: {exc}", "status": 409}
        except Exception as exc:  # a bug here must not take the API down
            return 500, {"error": f"{type(exc).__name__}: {exc}", "status": 500}

    async def _route(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        path = target.split("?", 1)[0]
        parts = [unquote(p, errors="strict") for p in path.strip("/").split("/")] if path.strip("/") else []
        if method == "PATCH":
            method = "POST"  # Toxiproxy treats PATCH and POST alike on update routes
        match parts:
            case ["version"]:
                self._allow(method, "GET")
                return 200, {"version": VERSION}
            case ["reset"]:
                self._allow(method, "POST")
                for proxy in self.proxies.values():
                    proxy.reset()
                return 204, None
            case ["proxies"]:
                self._allow(method, "GET", "POST")
                if method == "GET":
                    return 200, {name: p.state() for name, p in self.proxies.items()}
                return 201, await self._create_proxy(gojson.check_proxy(gojson.loads(body)))
            case ["proxies", name]:
                self._allow(method, "GET", "POST", "DELETE")
                proxy = self._proxy(name)
                if method == "GET":
                    return 200, proxy.state()
                if method == "DELETE":
                    del self.proxies[name]
                    await proxy.close()
                    return 204, None
                return 200, self._update_proxy(proxy, gojson.check_proxy(gojson.loads(body)))
            case ["proxies", name, "toxics"]:
                self._allow(method, "GET", "POST")
                proxy = self._proxy(name)
                if method == "GET":
                    return 200, proxy.toxics()
                return 200, self._create_toxic(proxy, gojson.check_toxic_wrapper(gojson.loads(body)))
            case ["proxies", name, "toxics", toxic]:
                self._allow(method, "GET", "POST", "DELETE")
                proxy = self._proxy(name)
                current = self._toxic(proxy, toxic)
                if method == "GET":
                    return 200, current.to_json()
                if method == "DELETE":
                    proxy.remove_toxic(toxic)
                    return 204, None
                update = gojson.check_toxic_update(current.type, gojson.loads(body))
                return 200, self._update_toxic(proxy, toxic, update)
        raise HttpError(404, f"no route {path[:200]!r}")

    @staticmethod
    def _allow(method: str, *allowed: str) -> None:
        if method not in allowed:
            raise HttpError(405, f"method {method[:20]} not allowed here (allowed: {', '.join(allowed)})")

    def _proxy(self, name: str) -> FaultProxy:
        try:
            return self.proxies[name]
        except KeyError:
            raise HttpError(404, "proxy not found") from None  # Toxiproxy's ErrProxyNotFound

    @staticmethod
    def _toxic(proxy: FaultProxy, name: str):
        try:
            return proxy.toxic(name)
        except NotFoundError:
            raise HttpError(404, "toxic not found") from None  # Toxiproxy's ErrToxicNotFound

    async def _create_proxy(self, req: dict[str, Any]) -> dict[str, Any]:
        _only(req, "proxy", "name", "listen", "upstream", "enabled", "seed")
        name = req.get("name")
        if not name:
            raise ValueError("missing required field: name")  # Toxiproxy's ErrMissingField texts
        if not req.get("upstream"):
            raise ValueError("missing required field: upstream")
        if name in self.proxies:
            raise HttpError(409, "proxy already exists")  # Toxiproxy checks this before it listens
        upstream = parse_hostport(req["upstream"], "upstream")
        listen = parse_hostport(req.get("listen", "127.0.0.1:0"), "listen")
        check_loopback(listen[0])
        enabled = req.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be true or false, got {enabled!r}")
        seed = req.get("seed", self.seed)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        proxy = FaultProxy(name, upstream, seed=seed, listen=listen)
        proxy.enabled = enabled
        await proxy.start()
        if name in self.proxies:  # created concurrently while we were starting
            await proxy.close()
            raise HttpError(409, "proxy already exists")
        self.proxies[name] = proxy
        return proxy.state()

    def _update_proxy(self, proxy: FaultProxy, req: dict[str, Any]) -> dict[str, Any]:
        _only(req, "proxy", "name", "listen", "upstream", "enabled", "toxics", "seed")
        if "name" in req and req["name"] != proxy.name:
            raise ValueError("a proxy cannot be renamed; delete it and create another")
        upstream = parse_hostport(req["upstream"], "upstream") if "upstream" in req else None
        listen = None
        if "listen" in req and req["listen"] != proxy.address:
            listen = parse_hostport(req["listen"], "listen")
            check_loopback(listen[0])
        enabled = req.get("enabled", proxy.enabled)
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be true or false, got {enabled!r}")
        if upstream is not None:
            proxy.set_upstream(upstream)
        if listen is not None:
            proxy.set_listen(listen)
        proxy.set_enabled(enabled)
        return proxy.state()

    def _create_toxic(self, proxy: FaultProxy, req: dict[str, Any]) -> dict[str, Any]:
        """Toxiproxy's order: the body's types, the stream, the type, a name taken (409), the attributes' types;
        then what the twin refuses beyond Toxiproxy (unknown fields and attributes, negative values, toxicity
        outside 0..1, slicer's sizes), each a 400 naming it.
        """
        stream = str(req.get("stream", "downstream"))
        if stream.lower() not in STREAMS:
            raise HttpError(400, "stream was invalid, can be either upstream or downstream")
        toxic_type = req.get("type", "")
        name = req.get("name") or f"{toxic_type}_{stream}"  # Toxiproxy's default name
        if toxic_type not in SCHEMA:
            raise HttpError(400, "invalid toxic type")
        if name in {t["name"] for t in proxy.toxics()}:
            raise HttpError(409, "toxic already exists")
        attributes = gojson.check_attributes(toxic_type, req.get("attributes"))
        _only(req, "toxic", "name", "type", "stream", "toxicity", "attributes")
        toxic = make_toxic(name, toxic_type, stream.lower(), req.get("toxicity", 1.0), attributes, aliases=False)
        return proxy.add_toxic_from(toxic.name, toxic.type, toxic.stream, toxic.toxicity, toxic.attributes)

    def _update_toxic(self, proxy: FaultProxy, name: str, req: dict[str, Any]) -> dict[str, Any]:
        _only(req, "toxic", "name", "type", "stream", "toxicity", "attributes")
        current = proxy.toxic(name)
        for key in ("name", "type", "stream"):
            if key in req and req[key] != getattr(current, key):
                raise ValueError(f"a toxic's {key} cannot be changed; delete it and add another")
        attributes = req.get("attributes") or {}
        merged = {**current.attributes, **attributes}
        make_toxic(name, current.type, current.stream, req.get("toxicity", current.toxicity), merged, aliases=False)
        return proxy.update_toxic_from(name, req.get("toxicity"), attributes)


def _only(req: dict[str, Any], what: str, *keys: str) -> None:
    unknown = sorted(set(req) - set(keys))
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown} (fields: {', '.join(keys)})")


async def serve(host: str = "127.0.0.1", port: int = 8474, seed: int = 0) -> None:
    """Run a ProxyServer until cancelled (python -m emulators.proxy)."""
    server = ProxyServer(host, port, seed=seed)
    await server.start()
    print(json.dumps({"api": server.address}), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await server.close()
