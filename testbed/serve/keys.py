"""The keys under which the server's aiohttp apps hold what their handlers share (aiohttp's typed AppKey)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from testbed.serve.identity import Peer

SERVICE_KEY: web.AppKey[Any] = web.AppKey("service")  # api.Service: the queue, the server's info, its actions
IDENTIFY_KEY: web.AppKey[Callable[[web.Request], Peer]] = web.AppKey("identify")  # who a request comes from
