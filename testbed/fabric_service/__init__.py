"""The job-side fabric service: a running job's ranks ask the framework for fabric configurations.

`protocol` is the wire format, `server` the coordinator's side, `client` the ranks' side (docs/fabric_service.md).
This package module imports nothing, so a rank importing the client loads only the protocol next to it.
"""
