"""The suite-wide record of daemon logs and test secrets (tests/testing/daemon_logs.h says
the same for C++): ctest sets $OPTSTATE_TEST_DAEMON_LOGS for every test, and
tests/testing/check_daemon_logs.py (ctest DaemonLogs.NoSecret, after every other test)
fails when any token recorded here, or its digest, is in any log kept there. Without the
variable (pytest run by hand) nothing is recorded."""
import itertools
import os
import pathlib
import shutil

_next = itertools.count()


def log_dir():
    value = os.environ.get("OPTSTATE_TEST_DAEMON_LOGS")
    return pathlib.Path(value) if value else None


def new_log_path():
    """A fresh file for one daemon's log, or None without the folder."""
    d = log_dir()
    return d / f"{os.getpid()}-py-daemon-{next(_next)}.log" if d else None


def keep_log(path):
    """Copies a log the test chose into the folder (replacing an earlier copy of it)."""
    d = log_dir()
    if d and pathlib.Path(path).exists():
        shutil.copyfile(path, d / f"{os.getpid()}-py-kept-{abs(hash(str(path)))}.log")


def record_secrets(*tokens):
    d = log_dir()
    if d:
        with open(d / f"{os.getpid()}-py.secrets", "a") as out:
            out.writelines(f"{t}\n" for t in tokens)
