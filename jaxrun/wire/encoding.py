"""The one encoding of every message between two of jaxrun's processes.

A message is a frozen dataclass registered under one word (``@message``).
It travels as one line: the word, a space, and its fields as a JSON array,
so a field may hold spaces, newlines or any bytes of text.  A field that
holds messages carries each as its own fields' array; the message that
holds them rebuilds them (``console.Reply``).

A channel that also passes file descriptors (the fork server's) sends each
message in a frame: its length in four bytes, big endian, then the message.
"""

import dataclasses
import json
import os
import socket
import struct
import types
from collections.abc import Mapping, Sequence
from typing import ClassVar


class WireError(ValueError):
    """A line that is not a message this version of jaxrun knows."""


_BY_WORD: dict[str, type] = {}
# Every message registered so far, by word; read-only.  A process imports the
# protocols it speaks; ``decode`` loads the others (``PROTOCOLS``) when a word
# is not here, so that it knows each word of this version of jaxrun.
WORDS: Mapping[str, type] = types.MappingProxyType(_BY_WORD)
PROTOCOLS = ("console", "controller", "forkserver", "inspect", "preflight", "probe", "ssh", "tasks")


def load_every_protocol() -> None:
    import importlib

    for name in PROTOCOLS:
        importlib.import_module(f"jaxrun.wire.{name}")


def message(word: str):
    """Register a frozen dataclass as the message spelled ``word``; a word
    that another message already has is refused at import."""

    def register(cls):
        if word in _BY_WORD:
            raise ValueError(f"the message word {word!r} is {_BY_WORD[word].__qualname__}'s already")
        cls = dataclasses.dataclass(frozen=True)(cls)
        cls.WORD = word
        _BY_WORD[word] = cls
        return cls

    return register


class Message:
    WORD: ClassVar[str]

    def fields(self) -> list:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def encode(self) -> bytes:
        """The message as one line, without its newline."""
        return f"{self.WORD} {json.dumps(self.fields(), separators=(',', ':'), default=_inner)}".encode()

    def line(self) -> bytes:
        return self.encode() + b"\n"


def _inner(value):
    if isinstance(value, Message):
        return value.fields()
    raise TypeError(f"a {type(value).__name__} is no message field")


def decode(data: bytes | str) -> Message:
    """The message one line holds (its newline may be there or not)."""
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    word, _, rest = text.strip().partition(" ")
    cls = WORDS.get(word)
    if cls is None:
        load_every_protocol()
        cls = WORDS.get(word)
    if cls is None:
        raise WireError(f"unknown message {word[:40]!r}")
    try:
        values = json.loads(rest or "[]")
        return cls(*values)
    except (ValueError, TypeError) as e:
        raise WireError(f"malformed {word} message: {e}") from None


# -- frames ------------------------------------------------------------------------
# A SOCK_STREAM Unix socket (macOS has no SOCK_SEQPACKET for AF_UNIX) carries
# one frame per message.  File descriptors ride on the frame's first byte
# (SCM_RIGHTS), and a reader takes exactly one frame's bytes at a time, so the
# descriptors of the next frame never come with this one.  An environment of
# any size fits in one frame; a longer "length" is a peer speaking something
# else.
FRAME_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 26  # 64 MiB


def send_frame(sock: socket.socket, payload: bytes, fds: Sequence[int] = ()) -> None:
    """Send one frame, with ``fds`` attached, whatever its size."""
    data = memoryview(FRAME_HEADER.pack(len(payload)) + payload)
    sent = socket.send_fds(sock, [data], list(fds)) if fds else 0
    sock.sendall(data[sent:])


def recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[bytes, list[int]] | None:
    """One frame and the descriptors that came with it; None once the peer
    has closed (even mid-frame).  OSError and WireError pass through."""
    header, fds = b"", []
    try:
        while len(header) < FRAME_HEADER.size:
            want = FRAME_HEADER.size - len(header)
            if max_fds:
                data, got, _, _ = socket.recv_fds(sock, want, max_fds)
                fds += got
            else:
                data = sock.recv(want)
            if not data:
                break
            header += data
        if len(header) < FRAME_HEADER.size:
            raise EOFError
        (length,) = FRAME_HEADER.unpack(header)
        if length > MAX_FRAME:
            raise WireError(f"a frame of {length} bytes: not a jaxrun peer")
        body = bytearray(length)
        view, got = memoryview(body), 0
        while got < length:
            n = sock.recv_into(view[got:])
            if not n:
                raise EOFError
            got += n
        return bytes(body), fds
    except EOFError:
        close_all(fds)
        return None
    except BaseException:
        close_all(fds)
        raise


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
