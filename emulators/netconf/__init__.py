"""A Polatis-style NETCONF server on the emulated switch (docs/protocols.md §7).

`framing` splits the byte stream into messages (RFC 6242: base:1.0 end-of-message and base:1.1 chunked
framing), `server` answers each message from the switch model (XML in, XML out, no I/O), and `frontend` serves
them as the SSH subsystem "netconf" on 127.0.0.1, one of the switch's front ends (emulators/frontends.py).
"""
