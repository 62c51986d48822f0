// The suite-wide record of the daemons' logs and of the secrets the tests
// made, for the check that no token or digest ever reaches a daemon's log
// (tests/testing/check_daemon_logs.py, ctest DaemonLogs.NoSecret, run after
// every other test). ctest sets $OPTSTATE_TEST_DAEMON_LOGS to the folder for
// every test; run by hand, without it, nothing is recorded.
#ifndef OPTSTATE_TESTS_TESTING_DAEMON_LOGS_H_
#define OPTSTATE_TESTS_TESTING_DAEMON_LOGS_H_

#include <string>
#include <vector>

namespace optstate::testing {

// $OPTSTATE_TEST_DAEMON_LOGS, or "" when it is not set.
std::string DaemonLogDir();

// A fresh file name in DaemonLogDir() for one daemon's log ("" without it).
std::string NewDaemonLogPath();

// Copies the log a test chose (`path`) into DaemonLogDir(), replacing the
// copy made of the same path before (a test may append several daemons to
// one file). No-op without the folder or when `path` cannot be read.
void KeepDaemonLog(const std::string& path);

// Adds `tokens` to the secrets the check looks for (it derives each digest
// itself). No-op without the folder.
void RecordTestSecrets(const std::vector<std::string>& tokens);

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_DAEMON_LOGS_H_
