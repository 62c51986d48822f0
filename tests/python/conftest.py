"""Fixtures of the Python package's tests: real optstated processes.

The daemon binary comes from $OPTSTATED (set by the ctests Python.test_* to
this build's optstated). A skipped test fails the run: every test here must
run wherever `make test` runs.
"""
import os
import re
import subprocess

import pytest

import optstate
import daemon_logs


class Daemon:
    """One optstated process on a free loopback port."""

    def __init__(self, *flags):
        binary = os.environ.get("OPTSTATED")
        if not binary or not os.path.exists(binary):
            raise RuntimeError("set OPTSTATED to the optstated binary (ctest Python.test_* does)")
        # The log goes to the suite's daemon-log folder when there is one (daemon_logs.py).
        self.log = daemon_logs.new_log_path()
        self.process = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", "--log_level=warning", "--threads=2", *flags],
            stdout=subprocess.PIPE, stderr=open(self.log, "w") if self.log else None, text=True)
        line = self.process.stdout.readline()
        match = re.search(r"listening on port (\d+)", line)
        if not match:
            self.process.kill()
            raise RuntimeError(f"optstated did not report its port: {line!r}")
        self.port = int(match.group(1))
        self.target = f"127.0.0.1:{self.port}"
        self.metrics_port = None  # With --metrics_listen: the port it reports next.
        if any(flag.startswith("--metrics_listen=") for flag in flags):
            line = self.process.stdout.readline()
            match = re.search(r"serving metrics on port (\d+)", line)
            if not match:
                self.process.kill()
                raise RuntimeError(f"optstated did not report its metrics port: {line!r}")
            self.metrics_port = int(match.group(1))

    def stop(self):
        """SIGTERM, and the exit status (0 for a clean shutdown)."""
        self.process.terminate()
        try:
            return self.process.wait(timeout=20)
        finally:
            self.process.stdout.close()


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    assert d.stop() == 0, "optstated did not shut down cleanly"


@pytest.fixture
def fresh_daemons():
    """Starts daemons of this test's own (fresh_daemons() -> Daemon); each is stopped at
    the end (if the test has not stopped it) and must exit cleanly."""
    started = []

    def start(*flags):
        started.append(Daemon(*flags))
        return started[-1]

    yield start
    for d in started:
        if d.process.poll() is None:
            assert d.stop() == 0, "optstated did not shut down cleanly"


@pytest.fixture
def client(daemon):
    return optstate.Client(daemon.target)


@pytest.fixture
def prefix(request):
    """A group-name prefix of this test's own, so tests share one daemon."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", request.node.name) + "/"


def pytest_report_header(config):
    return f"optstate package: {optstate.__file__}"


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    skipped = [r for r in reporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"{len(skipped)} test(s) skipped: every test must run", red=True)
        session.exitstatus = 1
