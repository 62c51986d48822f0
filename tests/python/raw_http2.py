"""A bare HTTP/2 client for gRPC calls that no gRPC library would make: requests whose
bodies are sent in part and never finished, with flow control honoured, so a test can see
what the daemon holds for them. Plaintext only; headers as HPACK literals."""
import select
import socket
import struct

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_INITIAL_WINDOW_SIZE = 4


def _frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def _length(value):
    """An HPACK string length with a 7-bit prefix, no Huffman coding."""
    if value < 127:
        return bytes([value])
    out, value = [127], value - 127
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    return bytes(out + [value])


def _headers(pairs):
    block = b""
    for name, value in pairs:
        name, value = name.encode(), value.encode()
        block += b"\x00" + _length(len(name)) + name + _length(len(value)) + value
    return block


class PartialRequests:
    """One connection to 127.0.0.1:`port`: open(path) starts a call whose message claims
    `claimed` bytes; feed(limit) sends body bytes on every open call, within the windows the
    daemon grants, until each has sent `limit` or was reset, or nothing moves for `stall`
    seconds."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(SETTINGS, 0, 0))
        self.connection_window = 65535
        self.initial_window = 65535
        self.windows, self.sent, self.reset = {}, {}, set()
        self.next_stream = 1
        self.gone = False
        self._buffer = b""

    def open(self, path, claimed, metadata=()):
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        pairs = [(":method", "POST"), (":scheme", "http"), (":path", path),
                 (":authority", "localhost"), ("content-type", "application/grpc"),
                 ("te", "trailers"), *metadata]
        prefix = b"\x00" + struct.pack(">I", claimed)
        self.sock.sendall(_frame(HEADERS, END_HEADERS, stream, _headers(pairs)) +
                          _frame(DATA, 0, stream, prefix))
        self.windows[stream] = self.initial_window - len(prefix)
        self.connection_window -= len(prefix)
        self.sent[stream] = 0

    def _read(self, wait):
        while not self.gone and select.select([self.sock], [], [], wait)[0]:
            wait = 0
            data = self.sock.recv(1 << 20)
            if not data:
                self.gone = True
                return
            self._buffer += data
            while len(self._buffer) >= 9:
                length = int.from_bytes(self._buffer[:3], "big")
                if len(self._buffer) < 9 + length:
                    break
                kind, flags = self._buffer[3], self._buffer[4]
                stream = int.from_bytes(self._buffer[5:9], "big") & 0x7FFFFFFF
                payload, self._buffer = self._buffer[9:9 + length], self._buffer[9 + length:]
                if kind == SETTINGS and not flags & ACK:
                    for at in range(0, len(payload), 6):
                        key, value = struct.unpack(">HI", payload[at:at + 6])
                        if key == SETTINGS_INITIAL_WINDOW_SIZE:
                            for s in self.windows:
                                self.windows[s] += value - self.initial_window
                            self.initial_window = value
                    self.sock.sendall(_frame(SETTINGS, ACK, 0))
                elif kind == WINDOW_UPDATE:
                    grant = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                    if stream == 0:
                        self.connection_window += grant
                    elif stream in self.windows:
                        self.windows[stream] += grant
                elif kind == RST_STREAM or (kind == HEADERS and flags & END_STREAM):
                    self.reset.add(stream)
                elif kind == PING and not flags & ACK:
                    self.sock.sendall(_frame(PING, ACK, 0, payload))
                elif kind == GOAWAY:
                    self.gone = True

    def feed(self, limit, stall=2.0, chunk=16384):
        idle = 0.0
        while idle < stall and not self.gone:
            moved = False
            for stream in self.sent:
                if stream in self.reset or self.sent[stream] >= limit:
                    continue
                n = min(chunk, limit - self.sent[stream], self.windows[stream],
                        self.connection_window)
                if n <= 0:
                    continue
                self.sock.sendall(_frame(DATA, 0, stream, bytes(n)))
                self.sent[stream] += n
                self.windows[stream] -= n
                self.connection_window -= n
                moved = True
            if all(s in self.reset or self.sent[s] >= limit for s in self.sent):
                break
            self._read(0 if moved else 0.2)
            idle = 0.0 if moved else idle + 0.2

    def close(self):
        self.sock.close()
