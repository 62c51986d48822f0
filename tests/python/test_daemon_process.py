"""optstated as an operator runs it: its log's reader gone (a collector restarted, a pipe
to `tee` broken) stops nothing; a --state_dir it cannot write is named at start, with the
reason. These tests start the daemon themselves, with the pipes and users they need."""
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest

import optstate


def start(*flags, stderr=subprocess.PIPE, user=None):
    """optstated on a free loopback port: (process, target). `user`: run as that uid/gid
    (setpriv), for a state_dir it may not write."""
    command = [os.environ["OPTSTATED"], "--listen=127.0.0.1:0", "--threads=2", *flags]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = process.stdout.readline()
    match = re.search(r"listening on port (\d+)", line)
    return process, (f"127.0.0.1:{match.group(1)}" if match else None)


# A daemon run as another user makes no region socket: a stale one of a root daemon at
# /tmp/optstated-PORT.regions (one killed, on a port picked again) it could not replace.
AS_NOBODY = ("--region_socket=none",)


@pytest.fixture
def shared_tmp():
    """A directory every user may enter (pytest's tmp_path is root's alone)."""
    path = tempfile.mkdtemp(prefix="optstate-process-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_log_reader_that_goes_away_stops_nothing(shared_tmp):
    # The first log line after the reader went was a write to a broken pipe: SIGPIPE
    # killed the daemon (exit 141), before any final checkpoint.
    state_dir = os.path.join(shared_tmp, "state")
    process, target = start(f"--state_dir={state_dir}", "--log_level=info")
    assert target, "optstated did not start"
    process.stderr.close()  # the log's reader is gone
    client = optstate.Client(target, data_plane="wire")
    values = np.arange(64, dtype=np.float32)
    client.register("after-the-reader", values, lr=1e-2)  # logged: a write to no reader
    client.step("after-the-reader", 1, np.ones(64, np.float32))
    assert [g.max_step for g in client.list_groups()] == [1]
    client.close()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert [d for d in os.listdir(state_dir) if d.startswith("ckpt-")], "no final checkpoint"


def test_a_state_dir_the_daemon_cannot_write_is_named_at_start(shared_tmp):
    if os.geteuid() != 0:
        pytest.fail("this test runs the daemon as another user: run it as root (as CI does)")
    nobody = 65534
    # No LOCK yet, and the daemon's user may not make one: the error was "No such file or
    # directory" (the read-only retry's), not the cause.
    closed = os.path.join(shared_tmp, "closed")
    os.mkdir(closed, 0o755)
    log = os.path.join(shared_tmp, "closed.log")
    with open(log, "w") as out:
        process, target = start(f"--state_dir={closed}", *AS_NOBODY, user=nobody, stderr=out)
        assert target is None and process.wait(timeout=30) != 0
    assert "Permission denied" in open(log).read()
    # A LOCK and a checkpoint an earlier daemon (root) left: the daemon restored it, served
    # and said nothing until its first checkpoint failed.
    written = os.path.join(shared_tmp, "written")
    first, target = start(f"--state_dir={written}", stderr=subprocess.DEVNULL)
    optstate.Client(target, data_plane="wire").register("kept", np.ones(8, np.float32), lr=0.1)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    log = os.path.join(shared_tmp, "written.log")
    with open(log, "w") as out:
        process, target = start(f"--state_dir={written}", *AS_NOBODY, user=nobody, stderr=out)
        assert target, open(log).read()
        assert [g.name for g in optstate.Client(target, data_plane="wire").list_groups()] == [
            "kept"]
        assert "cannot be written by this daemon (Permission denied)" in open(log).read()
        # The operator's to fix, as the warning said (it was INTERNAL).
        with pytest.raises(optstate.FailedPrecondition, match="Permission denied"):
            optstate.Client(target, data_plane="wire").checkpoint()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 3  # no final checkpoint, as the warning said


def test_a_taken_port_refuses_the_start_before_the_restore(shared_tmp):
    # The port was found taken only when the server bound it, after the restore (minutes
    # for a large state): a daemon in a crash loop restored each time.
    import socket
    state_dir = os.path.join(shared_tmp, "state")
    first, target = start(f"--state_dir={state_dir}", stderr=subprocess.DEVNULL)
    optstate.Client(target, data_plane="wire").register("kept", np.ones(8, np.float32), lr=0.1)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for flag in (f"--listen=127.0.0.1:{port}", f"--metrics_listen=127.0.0.1:{port}"):
            log = os.path.join(shared_tmp, "taken.log")
            with open(log, "w") as out:
                process = subprocess.run(
                    [os.environ["OPTSTATED"], "--listen=127.0.0.1:0", f"--state_dir={state_dir}",
                     "--log_level=info", flag], stdout=subprocess.DEVNULL, stderr=out,
                    timeout=30)
            text = open(log).read()
            assert process.returncode != 0, text
            assert f"cannot listen on 127.0.0.1:{port} ({flag.split('=')[0]})" in text, text
            assert "in use" in text and "restoring checkpoint" not in text, text
    finally:
        taken.close()


def test_a_moves_file_that_is_no_regular_file_is_refused_at_start(shared_tmp):
    # <state_dir>/MOVES as a FIFO hung the start for good (as a link to /dev/zero, it
    # read until memory ran out).
    state_dir = os.path.join(shared_tmp, "state")
    os.mkdir(state_dir)
    os.mkfifo(os.path.join(state_dir, "MOVES"))
    log = os.path.join(shared_tmp, "fifo.log")
    with open(log, "w") as out:
        process = subprocess.Popen(
            [os.environ["OPTSTATED"], "--listen=127.0.0.1:0", f"--state_dir={state_dir}"],
            stdout=subprocess.PIPE, stderr=out, text=True)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready, "optstated did not start within 30 s: " + open(log).read()
        match = re.search(r"listening on port (\d+)", process.stdout.readline())
        assert match, open(log).read()
        target = f"127.0.0.1:{match.group(1)}"
        assert "MOVES is not a regular file" in open(log).read()
        # Kept aside for the operator, not overwritten by the next seal.
        assert os.path.exists(os.path.join(state_dir, "MOVES.refused"))
        assert optstate.Client(target, data_plane="wire").list_groups() == []
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_a_second_signal_during_the_shutdown_is_answered_and_the_shutdown_goes_on(shared_tmp):
    # A second SIGTERM (or Ctrl-C) while the final checkpoint was written stayed pending
    # in silence: the operator could not tell whether it was heard, or what it would do.
    state_dir = os.path.join(shared_tmp, "state")
    process, target = start(f"--state_dir={state_dir}", "--log_level=info",
                            "--checkpoint_interval=0")
    assert target, "optstated did not start"
    client = optstate.Client(target, data_plane="wire")
    size = 1 << 24  # a final checkpoint of 192 MB: long enough to stop the daemon in it
    client.register("large", np.ones(size, np.float32), lr=1e-2)
    client.step("large", 1, np.full(size, 0.5, np.float32))
    client.close()
    process.send_signal(signal.SIGTERM)
    log = []
    while not any("shutting down" in line for line in log):
        ready, _, _ = select.select([process.stderr], [], [], 30)
        assert ready, "no shutdown line within 30 s: " + "".join(log)
        log.append(process.stderr.readline())
    # Stopped in the shutdown, the second signal cannot come after it.
    process.send_signal(signal.SIGSTOP)
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGCONT)
    rest = process.communicate(timeout=60)[1]
    assert process.returncode == 0, rest
    assert re.search(r"signal 15 during the shutdown: the shutdown goes on", rest), rest
    assert "SIGKILL stops at once" in rest, rest
    restarted, target = start(f"--state_dir={state_dir}", stderr=subprocess.DEVNULL)
    try:
        assert [g.max_step for g in optstate.Client(target, data_plane="wire").list_groups()] \
            == [1], "the final checkpoint was not written whole"
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(timeout=30) == 0


def test_help_lists_every_flag_whatever_the_binary_is_called(shared_tmp):
    # --help left out the shared-memory flags (another file's), and listed none at all for
    # a binary renamed (optstated-1.2); optstate-probe's listed none ever.
    renamed = os.path.join(shared_tmp, "optstated-1.2")
    shutil.copy(os.environ["OPTSTATED"], renamed)
    for binary in (os.environ["OPTSTATED"], renamed):
        text = subprocess.run([binary, "--help"], capture_output=True, text=True,
                              timeout=30).stdout
        for flag in ("--listen", "--state_dir", "--max_regions_per_client", "--socket_mode"):
            assert flag in text, (binary, flag, text)
    probe = os.path.join(os.path.dirname(os.environ["OPTSTATED"]), "probe", "optstate-probe")
    text = subprocess.run([probe, "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "--addr" in text and "--tls_ca" in text, text


@pytest.mark.parametrize("flag", ["--max_regions_per_client=0", "--max_regions=0",
                                  "--max_region_bytes=0"])
def test_a_region_limit_of_zero_is_refused_at_start_in_the_logs_format(flag):
    # Each was taken, and every shared-memory registration was then refused (clients on
    # data_plane="auto" fell back to the wire without a word); a start refused so printed
    # its reason without the log's level and time.
    run = subprocess.run([os.environ["OPTSTATED"], "--listen=127.0.0.1:0", flag],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2, run.stderr
    assert re.match(r"ERROR \S+ optstated: INVALID_ARGUMENT: " + re.escape(flag) +
                    " would refuse every shared-memory region", run.stderr), run.stderr
    assert "--region_socket=none" in run.stderr


def test_a_heap_trim_interval_under_a_second_is_refused_at_start():
    # --heap_trim_interval=1ns was taken, and its thread then looked at the heap in a loop:
    # a whole core of an idle daemon.
    for interval in ("1ns", "500ms", "-1s"):
        run = subprocess.run([os.environ["OPTSTATED"], "--listen=127.0.0.1:0",
                              f"--heap_trim_interval={interval}"],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode != 0, (interval, run.stderr)
        assert "--heap_trim_interval must be 0 (trim only after deletes) or at least 1s" in \
            run.stderr, run.stderr


def test_socket_mode_0000_closes_the_unix_listen_socket_as_the_region_socket(shared_tmp):
    # A mode of 0 was taken for "not set" for the gRPC socket alone: under umask 000 it
    # stayed srwxrwxrwx (anyone could connect) while its region socket got 0000.
    listen = os.path.join(shared_tmp, "d.sock")
    old_umask = os.umask(0)
    try:
        process = subprocess.Popen([os.environ["OPTSTATED"], f"--listen=unix:{listen}",
                                    "--threads=2", "--socket_mode=0000"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        os.umask(old_umask)
    try:
        assert "listening on port" in process.stdout.readline()
        assert os.stat(listen).st_mode & 0o777 == 0
        assert os.stat(listen + ".regions").st_mode & 0o777 == 0
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("flag", ["--staging_slots=-1", "--staging_slot_bytes=0",
                                  "--cuda_device=-1"])
def test_cuda_flags_out_of_bounds_are_refused_on_a_host_without_a_gpu_too(flag):
    # --backend=auto fell back to the CPU and took them: the same flags then refused the
    # start on a GPU host only.
    run = subprocess.run([os.environ["OPTSTATED"], "--listen=127.0.0.1:0", flag],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode != 0, run.stderr
    assert "INVALID_ARGUMENT: " + flag.split("=")[0] + " must be" in run.stderr, run.stderr


def test_a_max_host_bytes_that_holds_no_element_or_a_port_named_twice_is_refused():
    # --max_host_bytes=11 was taken (no group could ever register); --listen and
    # --metrics_listen on one port failed after the restore, "address in use or not valid?".
    for flags, message in ((["--max_host_bytes=11"], "--max_host_bytes=11 holds no group"),
                           (["--listen=127.0.0.1:47123", "--metrics_listen=127.0.0.1:47123"],
                            "name the same port: give each its own")):
        run = subprocess.run([os.environ["OPTSTATED"], "--listen=127.0.0.1:0", *flags],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode != 0 and message in run.stderr, (flags, run.stderr)


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _fill_descriptors(port, limit_of, pid, count=200):
    """Lowers the daemon's descriptor limit to 96 and opens `count` idle HTTP/2 connections
    to it: past the limit gRPC 1.51's accept fails with EMFILE, after which that listener
    never accepts again. Returns the sockets (the caller closes them)."""
    import resource
    import socket
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit_of, limit_of))
    flood = []
    for _ in range(count):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(_HTTP2_PREFACE)
        except OSError:  # the daemon stopped (exit 4) under the flood
            break
        flood.append(s)
    return flood


def test_a_listener_gone_at_the_descriptor_limit_stops_the_daemon_for_a_restart(shared_tmp):
    # With --state_dir: a final checkpoint, exit 4 (a supervisor restarts it), and the
    # restart serves the state of the last step.
    state = os.path.join(shared_tmp, "state")
    process, target = start(f"--state_dir={state}", "--region_socket=none")
    assert target
    c = optstate.Client(target)
    c.register("w", np.ones(1000, np.float32))
    c.step("w", 1, np.full(1000, 0.5, np.float32))
    flood = _fill_descriptors(int(target.rsplit(":", 1)[1]), 96, process.pid)
    try:
        status = process.wait(timeout=60)
    finally:
        for s in flood:
            s.close()
    log = process.stderr.read()
    assert status == 4, log
    assert "gRPC stopped accepting connections" in log
    assert "exiting with status 4" in log
    again, target = start(f"--state_dir={state}", "--region_socket=none")
    try:
        info = optstate.Client(target).describe("w")
        assert (info.min_step, info.max_step) == (1, 1)
    finally:
        again.terminate()
        assert again.wait(timeout=20) == 0


def test_a_listener_gone_at_the_descriptor_limit_without_state_dir_keeps_its_connections():
    # Without --state_dir a restart would lose the state: the daemon stays, serving the
    # connections it has, and says why no new one is accepted.
    process, target = start("--region_socket=none")
    assert target
    c = optstate.Client(target)
    c.register("w", np.ones(1000, np.float32))
    flood = _fill_descriptors(int(target.rsplit(":", 1)[1]), 96, process.pid)
    time.sleep(1)  # gRPC's accept has failed (EMFILE) by now
    for s in flood:
        s.close()
    params = np.empty(1000, np.float32)
    for step in range(1, 4):  # over the connection made before
        c.step([("w", np.full(1000, 0.5, np.float32), params)], step)
    assert process.poll() is None
    with pytest.raises((optstate.Unavailable, optstate.DeadlineExceeded)):
        optstate.Client(target, max_attempts=1, connect_timeout=1).list_groups()
    process.terminate()
    assert process.wait(timeout=20) == 0
    log = process.stderr.read()
    assert "gRPC stopped accepting connections" in log
    assert "only the connections already made are served" in log
