"""NETCONF message framing over SSH (RFC 6242 §4), both directions, without I/O.

- base:1.0, end-of-message (§4.3): each message is followed by `]]>]]>`. Hellos always use it (§4.1).
- base:1.1, chunked (§4.2): a message is one or more chunks `\\n#<size>\\n<size bytes>` then `\\n##\\n`; size is
  1..4294967295 without leading zeros. Both peers switch to it after the hellos if both advertised base:1.1.

The reader never holds more than `max_message` bytes of one message: a message that grows past it (an
end-of-message delimiter that never comes, chunks that add up) is a FramingError ("too-big"), as is a chunk
header that breaks the grammar ("malformed-message"). After a FramingError the stream cannot be resynchronised:
the caller answers once and closes the session. A message that never ends within the size cap is bounded in time
by the caller, which sees `in_message` and when it became true.
"""

from __future__ import annotations

import re

EOM = b"]]>]]>"
END_OF_CHUNKS = b"\n##\n"
MAX_CHUNK_SIZE = 4294967295  # RFC 6242 §4.2
DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024
_HEADER_MAX = len(b"\n#4294967295\n")
_CHUNK_HEADER = re.compile(rb"\n#([1-9][0-9]{0,9})\n")
_SPACE = b" \t\r\n"


class FramingError(Exception):
    """The byte stream broke the framing: `tag` is the RFC 6241 error-tag to answer with."""

    def __init__(self, message: str, tag: str = "malformed-message") -> None:
        super().__init__(message)
        self.tag = tag


class FrameReader:
    """Bytes in (`feed`), whole messages out (`next_message`), in the current framing (`chunked`).

    The caller switches `chunked` between two messages, right after the hellos, so bytes already buffered
    behind the hello are read in the new framing.
    """

    def __init__(self, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self.max_message = max_message
        self.chunked = False
        self._buf = bytearray()
        self._scanned = 0  # end-of-message mode: where the search for EOM resumes (a delimiter may be split)
        self._chunks: list[bytes] = []  # chunked mode: the current message's chunks so far
        self._size = 0  # bytes of the current message so far (chunked mode)
        self._need = 0  # chunked mode: bytes still due in the current chunk

    @property
    def in_message(self) -> bool:
        """Part of a message has arrived and its end has not (blank space between messages does not count)."""
        if self.chunked:
            return bool(self._chunks or self._need or self._buf)
        return bool(self._buf.strip(_SPACE))

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_message(self) -> bytes | None:
        """The next complete message, or None until more bytes arrive. Raises FramingError."""
        return self._next_chunked() if self.chunked else self._next_eom()

    # -- base:1.0 --------------------------------------------------------------------------------

    def _next_eom(self) -> bytes | None:
        while True:
            at = self._buf.find(EOM, self._scanned)
            if at < 0:
                if len(self._buf) > self.max_message + len(EOM):
                    raise FramingError(f"no end-of-message delimiter ]]>]]> within {self.max_message} bytes", "too-big")
                self._scanned = max(0, len(self._buf) - len(EOM) + 1)
                return None
            message = bytes(self._buf[:at]).strip(_SPACE)
            del self._buf[: at + len(EOM)]
            self._scanned = 0
            if len(message) > self.max_message:
                raise FramingError(f"a message of {len(message)} bytes exceeds {self.max_message}", "too-big")
            if message:  # blank space between two delimiters is no message
                return message

    # -- base:1.1 --------------------------------------------------------------------------------

    def _next_chunked(self) -> bytes | None:
        buf = self._buf
        while True:
            if self._need:
                take = min(self._need, len(buf))
                if not take:
                    return None
                self._chunks.append(bytes(buf[:take]))
                del buf[:take]
                self._need -= take
                continue
            if not buf:
                return None
            # A header: "\n#<size>\n" or the end of the message "\n##\n". Checked byte by byte as it arrives, so a
            # stream of garbage fails at once instead of filling the buffer.
            prefix = bytes(buf[:2])
            if not b"\n#".startswith(prefix):
                raise FramingError(f"expected a chunk header '\\n#<size>\\n', got {bytes(buf[:16])!r}")
            if len(buf) < 3:
                return None
            if buf[2:3] == b"#":
                if len(buf) < 4:
                    return None
                if buf[:4] != END_OF_CHUNKS:
                    raise FramingError(f"bad end-of-chunks marker {bytes(buf[:4])!r} (expected '\\n##\\n')")
                del buf[:4]
                if not self._chunks:
                    raise FramingError("end-of-chunks without a chunk (a message needs at least one)")
                message, self._chunks, self._size = b"".join(self._chunks), [], 0
                return message
            end = buf.find(b"\n", 2, _HEADER_MAX)
            if end < 0:
                if len(buf) >= _HEADER_MAX or not bytes(buf[2:]).isdigit():
                    raise FramingError(f"bad chunk header {bytes(buf[:_HEADER_MAX])!r}")
                return None
            m = _CHUNK_HEADER.fullmatch(bytes(buf[: end + 1]))
            if not m or int(m.group(1)) > MAX_CHUNK_SIZE:
                raise FramingError(
                    f"bad chunk header {bytes(buf[: end + 1])!r}: the size must be 1..{MAX_CHUNK_SIZE}, "
                    "without leading zeros"
                )
            size = int(m.group(1))
            if self._size + size > self.max_message:
                raise FramingError(
                    f"a message of more than {self.max_message} bytes (chunk of {size} after {self._size})", "too-big"
                )
            del buf[: end + 1]
            self._size += size
            self._need = size


def frame(message: bytes, chunked: bool, max_chunk: int = 65536) -> bytes:
    """One message framed for the wire: with `]]>]]>` after it, or in chunks of at most `max_chunk` bytes."""
    if not chunked:
        return message + EOM
    if not message:
        raise ValueError("a chunked message needs at least one byte")
    parts = []
    for i in range(0, len(message), max_chunk):
        piece = message[i : i + max_chunk]
        parts.append(b"\n#%d\n" % len(piece) + piece)
    parts.append(END_OF_CHUNKS)
    return b"".join(parts)
