"""How a model's process and the server talk: msgpack frames (msgspec), each a length and
one message, over a Unix socket pair. The receiving end decodes only the types it names, so
a frame can never build an object the schema does not name (no pickle)."""

from __future__ import annotations

import socket
import struct
import threading

import msgspec

_LENGTH = struct.Struct("!I")


class Channel:
    """One end of the socket pair: whole messages out (from any thread) and in (from one)."""

    def __init__(self, sock: socket.socket, receives: object) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(receives)
        self._send_lock = threading.Lock()

    def send(self, message: msgspec.Struct) -> bool:
        """Send one message; False if the other end has gone."""
        payload = self._encoder.encode(message)
        try:
            with self._send_lock:
                self.sock.sendall(_LENGTH.pack(len(payload)) + payload)
        except OSError:
            return False
        return True

    def receive(self) -> object | None:
        """The next message; None once the other end has gone (or closed its end)."""
        header = self._read(_LENGTH.size)
        if header is None:
            return None
        body = self._read(_LENGTH.unpack(header)[0])
        return None if body is None else self._decoder.decode(body)

    def _read(self, n: int) -> bytes | None:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except OSError:
                return None
            if k == 0:
                return None
            got += k
        return bytes(buf)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
