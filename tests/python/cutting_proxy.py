"""A TCP proxy in front of a daemon that can cut every connection mid-stream."""
import socket
import threading


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to `upstream`. After arm(n), once n more bytes went from
    the client to the daemon, every open connection is cut (both sockets shut down); new
    connections are forwarded again, after arm's `then` (if any) has run: new connections
    wait for it, so it can replace the daemon (retarget() to its port) before any client
    reaches one."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target = f"127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.open = []  # (client socket, upstream socket)
        self.remaining = None
        self.then = None
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.cuts = 0
        self.connections = 0
        self.refusing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, nbytes, then=None):
        with self.lock:
            self.remaining = nbytes
            self.then = then

    def refuse(self, on):
        """On: every open connection is cut, and each new one closed at once (the daemon
        looks down to the client); off: forwarded again."""
        with self.lock:
            self.refusing = on
        if on:
            self._cut_all()

    def retarget(self, upstream_port):
        """New connections go to `upstream_port` from now on."""
        with self.lock:
            self.upstream_port = upstream_port

    def _accept(self):
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            self.forwarding.wait()
            with self.lock:
                upstream_port = self.upstream_port
                refusing = self.refusing
            if refusing:
                downstream.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", upstream_port))
            except OSError:
                downstream.close()
                continue
            pair = (downstream, upstream)
            with self.lock:
                self.open.append(pair)
                self.connections += 1
            threading.Thread(target=self._pump, args=(downstream, upstream, True, pair),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, False, pair),
                             daemon=True).start()

    def _pump(self, source, sink, to_daemon, pair):
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            cut = False
            if to_daemon:
                with self.lock:
                    if self.remaining is not None:
                        self.remaining -= len(data)
                        if self.remaining <= 0:
                            self.remaining = None
                            cut = True
                            then, self.then = self.then, None
            if cut:
                if then is not None:
                    self.forwarding.clear()
                self._cut_all()
                if then is not None:
                    try:
                        then()
                    finally:
                        self.forwarding.set()
                break
            try:
                sink.sendall(data)
            except OSError:
                break
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _cut_all(self):
        with self.lock:
            pairs, self.open = self.open, []
            self.cuts += 1
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()
        self._cut_all()
