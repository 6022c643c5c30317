"""What the twin's SSH servers share (the GPU hosts' exec server, the switches' NETCONF subsystem): a paramiko
server transport that says when a channel request has been answered on the wire, and the public-key check.

paramiko calls a ServerInterface's check_channel_*_request before it sends the reply. A server that starts
the channel's work there (runs the command, sends the NETCONF hello) can finish and close the channel before
the client has seen "request succeeded", and the client then reports "Channel closed" (a fast command on a
busy machine did). So the servers only record the request there, and start when the interface's
`answered(chanid)` is called, which `AnsweringTransport` does right after the reply is on the wire.
"""

from __future__ import annotations

import paramiko


def _handle_request_then_answered(channel: paramiko.Channel, m: paramiko.Message) -> None:
    paramiko.Channel._handle_request(channel, m)  # answers the request on the wire (success or failure)
    server = channel.transport.server_object if channel.transport is not None else None
    answered = getattr(server, "answered", None)
    if answered is not None:
        answered(channel.get_id())


class AnsweringTransport(paramiko.Transport):
    """paramiko's server transport, calling its server interface's `answered(chanid)` once a channel request
    has been answered.
    """

    _channel_handler_table = {
        **paramiko.Transport._channel_handler_table,
        paramiko.common.MSG_CHANNEL_REQUEST: _handle_request_then_answered,
    }


def key_accepted(user: str, client_key: paramiko.PKey, username: str, key: paramiko.PKey) -> bool:
    """Whether `username` logging in with `key` is the one user with the one key the server accepts."""
    return username == user and key.get_name() == client_key.get_name() and key.asbytes() == client_key.asbytes()
