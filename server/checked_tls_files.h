// The TLS files the daemon serves, as copies it has checked.
//
// gRPC 1.51's FileWatcherCertificateProvider serves whatever the files hold
// each time it looks: a certificate that does not parse, a key that is not
// the certificate's, a missing file or client roots that do not parse make
// every new handshake fail until the files are fixed, and a certificate and
// key renamed in one after the other are a mismatched pair between the two
// renames. So the watcher is pointed at copies in memfds (/proc/self/fd/N,
// nothing on disk; the key and the chain in one, given to gRPC as both
// files, so that one dup3 replaces the pair), and this class replaces the
// copies only with a set of files that passes the checks made at start; a set that does not pass
// leaves the previous one served and is logged (as ERROR once the same bad
// set is seen on two looks in a row, so that a replacement in progress is
// not reported).
#ifndef OPTSTATE_SERVER_CHECKED_TLS_FILES_H_
#define OPTSTATE_SERVER_CHECKED_TLS_FILES_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace optstate {

struct TlsFilePaths {
  std::string cert_file;       // PEM certificate chain, leaf first.
  std::string key_file;        // PEM private key of cert_file's leaf.
  std::string client_ca_file;  // PEM roots; empty: none.
};

// What the files hold, read at one look.
struct TlsFileContents {
  std::string cert, key, client_ca;
  bool operator==(const TlsFileContents& other) const {
    return cert == other.cert && key == other.key && client_ca == other.client_ca;
  }
};

// Reads the files; INVALID_ARGUMENT naming the flag for one that cannot be
// read.
absl::StatusOr<TlsFileContents> ReadTlsFiles(const TlsFilePaths& paths);

// OK when gRPC can serve `contents`: every PEM certificate in the chain and
// the roots parses (at least one each), the key parses and is the key of
// the chain's first certificate. Else INVALID_ARGUMENT naming the flag and
// the fault. With `refuse_outdated`, also a first certificate that is not
// yet valid or has expired.
absl::Status CheckTlsFiles(const TlsFilePaths& paths, const TlsFileContents& contents,
                           bool refuse_outdated);

class CheckedTlsFiles {
 public:
  // Reads and checks the files (CheckTlsFiles, outdated certificates
  // allowed: a client then says the certificate has expired) and copies
  // them; then looks at them every `interval` on a thread of its own.
  // Where memfds or /proc/self/fd are not available, the paths are the
  // files themselves, unchecked after start, and a WARNING says so.
  static absl::StatusOr<std::unique_ptr<CheckedTlsFiles>> Open(const TlsFilePaths& paths,
                                                               absl::Duration interval);
  // Stops looking and closes the copies: keep it alive as long as gRPC's
  // watcher reads them (the server's lifetime).
  ~CheckedTlsFiles();
  CheckedTlsFiles(const CheckedTlsFiles&) = delete;
  CheckedTlsFiles& operator=(const CheckedTlsFiles&) = delete;

  // The paths for gRPC's watcher; client_ca_path() is empty without roots.
  const std::string& cert_path() const { return served_.cert_file; }
  const std::string& key_path() const { return served_.key_file; }
  const std::string& client_ca_path() const { return served_.client_ca_file; }

  // One look (the thread makes one every interval): a changed set that
  // passes CheckTlsFiles (outdated certificates refused) replaces the
  // copies. Returns why the files as they are now are not served; OK when
  // they are.
  absl::Status LookNow() ABSL_LOCKS_EXCLUDED(mu_);

  struct Served {
    // When the served chain's first certificate expires (Unix seconds).
    int64_t not_after_unix = 0;
    // The files changed and were not served (the previous ones are): set
    // with the ERROR, when the same bad set was seen on two looks.
    bool files_refused = false;
  };
  Served served() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CheckedTlsFiles(TlsFilePaths paths, absl::Duration interval);
  absl::Status Stage(const TlsFileContents& contents) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watch();

  const TlsFilePaths paths_;
  const absl::Duration interval_;
  TlsFilePaths served_;  // The paths gRPC reads.
  // The descriptors behind served_ (-1 where served_ names the file itself):
  // the key and the chain in one copy, the roots in another.
  int identity_fd_ = -1, client_ca_fd_ = -1;
  mutable absl::Mutex mu_;
  TlsFileContents staged_ ABSL_GUARDED_BY(mu_);
  int64_t staged_not_after_ ABSL_GUARDED_BY(mu_) = 0;
  // The copies' mtime in seconds, one more at least for each set: gRPC
  // reads the key and the chain apart (from the one copy) and reads again
  // when its mtime moved in between, so a set replaced mid-read is never
  // paired.
  int64_t staged_mtime_ ABSL_GUARDED_BY(mu_) = 0;
  // The last look's files when they were not served (what they held and
  // why), and whether that has been logged.
  std::string refused_ ABSL_GUARDED_BY(mu_);
  bool refused_logged_ ABSL_GUARDED_BY(mu_) = false;
  // Since an ERROR, until files are served again (another bad set keeps it).
  bool refusing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_CHECKED_TLS_FILES_H_
