#!/usr/bin/env python3
"""No token, and no digest of one, in any daemon log the suite kept.

The tests record every token they make in DIR/*.secrets (one per line) and keep
every daemon's log in DIR/*.log (tests/testing/daemon_logs.h, tests/python/daemon_logs.py).
This looks in each log for each token, its lowercase and uppercase hex SHA-256
(what a tokens file holds) and its base64 SHA-256, and names the log and the
secret's place in the record, never the secret. Exit 1 on a find, or when
secrets were recorded but no log was kept (the recording is broken).

  check_daemon_logs.py DIR      the check (ctest DaemonLogs.NoSecret)
  check_daemon_logs.py --self-test   the check held to planted secrets
"""
import base64
import hashlib
import pathlib
import sys
import tempfile


def forms_of(token):
    digest = hashlib.sha256(token.encode()).digest()
    return {"the token": token, "its hex digest": digest.hex(),
            "its upper-case hex digest": digest.hex().upper(),
            "its base64 digest": base64.b64encode(digest).decode()}


def find_secrets(directory):
    """(finds, number of logs, bytes of logs, number of secrets)."""
    directory = pathlib.Path(directory)
    secrets = []
    for record in sorted(directory.glob("*.secrets")):
        for number, line in enumerate(record.read_text().splitlines(), 1):
            if line:
                secrets.append((f"{record.name} line {number}", line))
    logs = sorted(directory.glob("*.log"))
    finds, total = [], 0
    for log in logs:
        text = log.read_bytes().decode("utf-8", "replace")
        total += len(text)
        for where, token in secrets:
            for form, value in forms_of(token).items():
                if value in text:
                    finds.append(f"{log.name}: {form} of the secret at {where}")
    return finds, len(logs), total, len(secrets)


def check(directory):
    finds, logs, total, secrets = find_secrets(directory)
    if finds:
        print("secrets in daemon logs:\n  " + "\n  ".join(finds))
        return 1
    if secrets and not logs:
        print(f"{secrets} secrets recorded in {directory} but no daemon log was kept")
        return 1
    print(f"{logs} daemon logs ({total} characters) held none of {secrets} recorded secrets "
          "(as token, hex, upper-case hex or base64 digest)")
    return 0


def self_test():
    token = "planted-token-0c1d"
    forms = forms_of(token)
    with tempfile.TemporaryDirectory() as work:
        d = pathlib.Path(work)
        (d / "1.secrets").write_text("other-token\n" + token + "\n")
        (d / "clean.log").write_text("INFO a log with nothing secret\n")
        assert check(d) == 0, "a clean log was flagged"
        for form, value in forms.items():
            (d / "dirty.log").write_text(f"DEBUG call from tenant a with {value} in it\n")
            finds, _, _, _ = find_secrets(d)
            assert finds == [f"dirty.log: {form} of the secret at 1.secrets line 2"], finds
            assert check(d) == 1
        (d / "dirty.log").unlink()
        (d / "clean.log").unlink()
        assert check(d) == 1, "secrets with no log must fail"
    print("self-test: every planted form found, clean logs pass")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(check(sys.argv[1]))
