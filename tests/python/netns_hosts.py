"""Stand-in hosts for the scale-out tests: network namespaces joined by a bridge.

Hosts(n) makes a bridge namespace and, per host, a namespace whose veth pair
ends in the bridge; this process's namespace gets one more pair, so it reaches
every host's address in 198.51.100.0/24 (the documentation range, RFC 5737) as
across a network. Each host runs one optstated on HOST_IP:50051. Everything is
named after this process's pid and removed by close(), also after a failure; what a killed
run left is removed by the next.
Test traffic goes to these addresses and to loopback only.
"""
import os
import re
import socket
import subprocess
import threading
import time

import daemon_logs

PORT = 50051
_made = iter(range(10 ** 6))


def run(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=60)


class Host:
    def __init__(self, hosts, index):
        self.hosts, self.index = hosts, index
        self.ns = f"os{hosts.tag}h{index}"
        self.ip = f"198.51.100.{10 + index}"
        self.inner = f"os{hosts.tag}i{index}"  # The host's end of its link.
        self.outer = f"os{hosts.tag}o{index}"  # The bridge's end.
        self.target = f"{self.ip}:{PORT}"
        self.process = None
        self.log = None

    def start(self, *flags):
        """Starts optstated in this host's namespace and waits for its port."""
        self.log = daemon_logs.new_log_path()
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, os.environ["OPTSTATED"],
             f"--listen={self.target}", "--allow_insecure_remote", "--region_socket=none",
             "--threads=1", "--log_level=warning", *flags],
            stdout=subprocess.PIPE, stderr=open(self.log, "w") if self.log else None, text=True)
        line = self.process.stdout.readline()
        if not re.search(r"listening on port \d+", line):
            self.process.kill()
            raise RuntimeError(f"optstated on {self.ns} did not start: {line!r}")
        return self

    def kill(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=20)

    def stop(self):
        """SIGTERM; the exit status (0 for a clean shutdown)."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.terminate()
        try:
            return self.process.wait(timeout=30)
        finally:
            self.process.stdout.close()

    def link(self, up):
        """Sets the host's link up or down (a cut cable, as seen from both ends)."""
        state = "up" if up else "down"
        run("ip", "-n", self.ns, "link", "set", self.inner, state)

    def limit_rate(self, rate="1gbit"):
        """tbf on both ends of the host's link: at most `rate` each way."""
        run("tc", "-n", self.ns, "qdisc", "replace", "dev", self.inner, "root", "tbf",
            "rate", rate, "burst", "256kb", "latency", "100ms")
        run("tc", "-n", self.hosts.bridge, "qdisc", "replace", "dev", self.outer, "root", "tbf",
            "rate", rate, "burst", "256kb", "latency", "100ms")


def _dead(pid):
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def remove_leftovers():
    """What a run killed before its cleanup left: namespaces and links named
    os<pid>n<count>... whose process is gone (they would hold this range's addresses)."""
    for line in run("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = re.fullmatch(r"os(\d+)n\d+(br|h\d+)", name)
        if match and _dead(match.group(1)):
            run("ip", "netns", "del", name, check=False)
    for line in run("ip", "-br", "link").stdout.splitlines():
        name = line.split()[0].split("@")[0] if line.strip() else ""
        match = re.fullmatch(r"os(\d+)n\d+r", name)
        if match and _dead(match.group(1)):
            run("ip", "link", "del", name, check=False)


class Hosts:
    def __init__(self, count):
        self.tag = f"{os.getpid()}n{next(_made) % 100}"
        self.bridge = f"os{self.tag}br"
        self.root_end = f"os{self.tag}r"
        self.hosts = []
        remove_leftovers()
        try:
            run("ip", "netns", "add", self.bridge)
            run("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
            run("ip", "-n", self.bridge, "link", "set", "br0", "up")
            # This process's own end, 198.51.100.1.
            run("ip", "link", "add", self.root_end, "type", "veth", "peer", "name", "up0",
                "netns", self.bridge)
            run("ip", "-n", self.bridge, "link", "set", "up0", "master", "br0", "up")
            run("ip", "addr", "add", "198.51.100.1/24", "dev", self.root_end)
            run("ip", "link", "set", self.root_end, "up")
            for i in range(count):
                self.add()
        except BaseException:
            self.close()
            raise

    def add(self):
        """One more host (its namespace and link); returns it, its daemon not started."""
        h = Host(self, len(self.hosts))
        self.hosts.append(h)
        run("ip", "netns", "add", h.ns)
        run("ip", "-n", h.ns, "link", "add", h.inner, "type", "veth", "peer", "name", h.outer,
            "netns", self.bridge)
        run("ip", "-n", self.bridge, "link", "set", h.outer, "master", "br0", "up")
        run("ip", "-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", h.inner)
        run("ip", "-n", h.ns, "link", "set", h.inner, "up")
        run("ip", "-n", h.ns, "link", "set", "lo", "up")
        return h

    def __getitem__(self, i):
        return self.hosts[i]

    def __len__(self):
        return len(self.hosts)

    def close(self):
        """Stops every daemon (each must exit cleanly unless killed) and removes it all."""
        statuses = []
        for h in self.hosts:
            statuses.append(h.stop())
            if h.log:
                daemon_logs.keep_log(h.log)
        for h in self.hosts:
            run("ip", "netns", "del", h.ns, check=False)
        run("ip", "link", "del", self.root_end, check=False)
        run("ip", "netns", "del", self.bridge, check=False)
        return statuses


class DelayProxy:
    """Forwards 127.0.0.1:<port> to `target` ("ip:port"), holding every piece of data for
    `delay` seconds before passing it on, both ways (netem is not in this kernel)."""

    def __init__(self, target, delay=0.001):
        host, port = target.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.target = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            for s in (down, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sockets += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source, sink):
        try:
            while True:
                data = source.recv(1 << 20)
                if not data:
                    break
                time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.listener.close()
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass
