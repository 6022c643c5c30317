"""Fixtures for the fault proxy tests (see proxy_harness.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from proxy_harness import EchoServer, LoopThread, Proxies


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


@pytest.fixture(scope="module")
def echo(loop: LoopThread) -> Iterator[EchoServer]:
    server = EchoServer()
    loop.run(server.start())
    yield server
    loop.run(server.close())


@pytest.fixture
def make_proxy(loop: LoopThread, echo: EchoServer) -> Iterator[Proxies]:
    proxies = Proxies(loop, echo)
    yield proxies
    proxies.close()
