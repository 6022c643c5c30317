"""ProxyServer: Toxiproxy's HTTP API shape over FaultProxy, so Toxiproxy clients can drive it.

A minimal HTTP/1.1 server on 127.0.0.1 (keep-alive, Content-Length bodies only, JSON in and out).
Routes, status codes and error bodies ({"error": ..., "status": ...}) follow Toxiproxy 2.x:

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

Malformed requests get 400 and the connection is closed; unknown routes 404; a known route with
another method 405. `listen` must be a loopback address (port 0 = ephemeral); anything else is 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import unquote

from emulators.proxy.core import FaultProxy, check_loopback, parse_hostport
from emulators.proxy.toxics import ConflictError, NotFoundError

MAX_HEADER = 16 * 1024
MAX_BODY = 1024 * 1024
IDLE_TIMEOUT = 60.0
VERSION = "testbed-faultproxy-1"
_REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
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
                status, payload = await self.handle(method, target, body)
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
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        head.append("Connection: keep-alive" if keep_alive else "Connection: close")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()

    # --- routes ----------------------------------------------------------------------------------

    async def handle(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        """One request -> (status, JSON payload); never raises."""
        try:
            return await self._route(method, target, body)
        except HttpError as exc:
            return exc.status, {"error": exc.message, "status": exc.status}
        except NotFoundError as exc:
            return 404, {"error": str(exc), "status": 404}
        except ConflictError as exc:
            return 409, {"error": str(exc), "status": 409}
        except ValueError as exc:
            return 400, {"error": str(exc), "status": 400}
        except OSError as exc:  # e.g. the listen port is taken
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
                return 201, await self._create_proxy(_json_object(body))
            case ["proxies", name]:
                self._allow(method, "GET", "POST", "DELETE")
                proxy = self._proxy(name)
                if method == "GET":
                    return 200, proxy.state()
                if method == "DELETE":
                    del self.proxies[name]
                    await proxy.close()
                    return 204, None
                return 200, self._update_proxy(proxy, _json_object(body))
            case ["proxies", name, "toxics"]:
                self._allow(method, "GET", "POST")
                proxy = self._proxy(name)
                if method == "GET":
                    return 200, proxy.toxics()
                return 200, self._create_toxic(proxy, _json_object(body))
            case ["proxies", name, "toxics", toxic]:
                self._allow(method, "GET", "POST", "DELETE")
                proxy = self._proxy(name)
                if method == "GET":
                    return 200, proxy.toxic(toxic).to_json()
                if method == "DELETE":
                    proxy.remove_toxic(toxic)
                    return 204, None
                return 200, self._update_toxic(proxy, toxic, _json_object(body))
        raise HttpError(404, f"no route {path[:200]!r}")

    @staticmethod
    def _allow(method: str, *allowed: str) -> None:
        if method not in allowed:
            raise HttpError(405, f"method {method[:20]} not allowed here (allowed: {', '.join(allowed)})")

    def _proxy(self, name: str) -> FaultProxy:
        try:
            return self.proxies[name]
        except KeyError:
            raise NotFoundError(f"proxy {name!r} not found") from None

    async def _create_proxy(self, req: dict[str, Any]) -> dict[str, Any]:
        _only(req, "proxy", "name", "listen", "upstream", "enabled", "seed")
        name = req.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("missing required field: name")
        if "upstream" not in req:
            raise ValueError("missing required field: upstream")
        upstream = parse_hostport(req["upstream"], "upstream")
        listen = parse_hostport(req.get("listen", "127.0.0.1:0"), "listen")
        check_loopback(listen[0])
        enabled = req.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be true or false, got {enabled!r}")
        seed = req.get("seed", self.seed)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if name in self.proxies:
            raise ConflictError(f"proxy {name!r} already exists")
        proxy = FaultProxy(name, upstream, seed=seed, listen=listen)
        proxy.enabled = enabled
        await proxy.start()
        if name in self.proxies:  # created concurrently while we were starting
            await proxy.close()
            raise ConflictError(f"proxy {name!r} already exists")
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
        _only(req, "toxic", "name", "type", "stream", "toxicity", "attributes")
        toxic_type = req.get("type")
        stream = req.get("stream", "downstream")
        name = req.get("name") or f"{toxic_type}_{stream}"  # Toxiproxy's default name
        attributes = req.get("attributes")
        attributes = {} if attributes is None else attributes
        if not isinstance(attributes, dict):
            raise ValueError(f"attributes must be an object, got {attributes!r}")
        return proxy.add_toxic_from(name, toxic_type, stream, req.get("toxicity", 1.0), attributes)

    def _update_toxic(self, proxy: FaultProxy, name: str, req: dict[str, Any]) -> dict[str, Any]:
        _only(req, "toxic", "name", "type", "stream", "toxicity", "attributes")
        current = proxy.toxic(name)
        for key in ("name", "type", "stream"):
            if key in req and req[key] != getattr(current, key):
                raise ValueError(f"a toxic's {key} cannot be changed; delete it and add another")
        attributes = req.get("attributes")
        attributes = {} if attributes is None else attributes
        if not isinstance(attributes, dict):
            raise ValueError(f"attributes must be an object, got {attributes!r}")
        return proxy.update_toxic_from(name, req.get("toxicity"), attributes)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body) if body.strip() else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"bad request body: {exc}") from None
    if not isinstance(value, dict):
        raise HttpError(400, f"bad request body: expected a JSON object, got {type(value).__name__}")
    return value


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
