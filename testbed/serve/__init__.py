"""`testbed serve`: a lab's own server (docs/serve.md). One warm testbed.Lab for the lab's inventory, a queue of
the runs its users submit, executed one after another through Lab.run, and an HTTP API on a Unix socket whose
callers are told apart by the kernel (SO_PEERCRED).

- identity: who a caller is, where the socket is;
- queue: the runs, queued, running and done, and the log of events clients follow;
- api: the HTTP API (aiohttp) and its OpenAPI document;
- server: the runner (the main thread, where signals stop a run as Ctrl-C does) and the API's thread;
- client: the standard library's HTTP over the socket, for the CLI and scripts.
"""
