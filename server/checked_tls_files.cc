#include "server/checked_tls_files.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/base/log.h"

namespace optstate {
namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot be read (", std::strerror(errno), ")"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status NeedsBlock(const std::string& flag, const std::string& path, const std::string& text,
                        absl::string_view block) {
  if (absl::StrContains(text, "-----BEGIN") && absl::StrContains(text, block)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": holds no PEM ", block));
}

// A BIO over `text` that frees itself.
struct MemoryBio {
  explicit MemoryBio(const std::string& text)
      : bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size()))) {}
  ~MemoryBio() { BIO_free(bio); }
  BIO* bio;
};

// The certificates of a PEM text, in order; an empty vector when a block
// does not parse. The caller frees them.
std::vector<X509*> ParseCertificates(const std::string& text) {
  std::vector<X509*> certificates;
  MemoryBio in(text);
  if (in.bio == nullptr) return certificates;
  ERR_clear_error();
  while (X509* certificate = PEM_read_bio_X509(in.bio, nullptr, nullptr, nullptr)) {
    certificates.push_back(certificate);
  }
  // The loop ends at the text's end (no start line follows) or at a block
  // that does not parse.
  const unsigned long error = ERR_peek_last_error();
  const bool at_end =
      ERR_GET_LIB(error) == ERR_LIB_PEM && ERR_GET_REASON(error) == PEM_R_NO_START_LINE;
  ERR_clear_error();
  if (!at_end) {
    for (X509* certificate : certificates) X509_free(certificate);
    certificates.clear();
  }
  return certificates;
}

std::string TimeText(const ASN1_TIME* time) {
  BIO* out = BIO_new(BIO_s_mem());
  if (out == nullptr) return "?";
  ASN1_TIME_print(out, time);
  char* data = nullptr;
  const long size = BIO_get_mem_data(out, &data);
  std::string text(data, size > 0 ? static_cast<size_t>(size) : 0);
  BIO_free(out);
  return text;
}

absl::Status CheckCertificateAndKey(const TlsFilePaths& paths, const TlsFileContents& contents,
                                    bool refuse_outdated) {
  std::vector<X509*> chain = ParseCertificates(contents.cert);
  if (chain.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert=", paths.cert_file, ": a certificate in it does not parse"));
  }
  X509* leaf = chain[0];
  EVP_PKEY* key = nullptr;
  {
    MemoryBio in(contents.key);
    // No password: an encrypted key is refused, never prompted for on a tty.
    pem_password_cb* no_password = [](char*, int, int, void*) { return 0; };
    if (in.bio != nullptr) key = PEM_read_bio_PrivateKey(in.bio, nullptr, no_password, nullptr);
  }
  absl::Status status;
  if (key == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--tls_key=", paths.key_file,
                     ": the private key does not parse (an encrypted key is not supported)"));
  } else if (X509_check_private_key(leaf, key) != 1) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls_key=", paths.key_file, " is not the key of --tls_cert=", paths.cert_file,
        " (its first certificate): every handshake would fail; give the certificate's own key"));
  } else if (refuse_outdated && X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
    status = absl::InvalidArgumentError(absl::StrCat("--tls_cert=", paths.cert_file,
                                                     ": its first certificate is not valid until ",
                                                     TimeText(X509_get0_notBefore(leaf))));
  } else if (refuse_outdated && X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
    status = absl::InvalidArgumentError(absl::StrCat("--tls_cert=", paths.cert_file,
                                                     ": its first certificate expired on ",
                                                     TimeText(X509_get0_notAfter(leaf))));
  }
  ERR_clear_error();
  EVP_PKEY_free(key);
  for (X509* certificate : chain) X509_free(certificate);
  return status;
}

// When the first certificate of `pem` expires, in Unix seconds; 0 when it
// does not parse.
int64_t NotAfterUnix(const std::string& pem) {
  std::vector<X509*> chain = ParseCertificates(pem);
  if (chain.empty()) return 0;
  struct tm when = {};
  const bool read = ASN1_TIME_to_tm(X509_get0_notAfter(chain[0]), &when) == 1;
  for (X509* certificate : chain) X509_free(certificate);
  return read ? static_cast<int64_t>(timegm(&when)) : 0;
}

// A sealed, read-only memfd holding `data`, its mtime set to `mtime`
// seconds; -1 and errno on failure.
int SealedCopy(const char* name, const std::string& data, int64_t mtime) {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      close(fd);
      errno = saved;
      return -1;
    }
    written += static_cast<size_t>(n);
  }
  const struct timespec times[2] = {{static_cast<time_t>(mtime), 0},
                                    {static_cast<time_t>(mtime), 0}};
  if (fchmod(fd, 0400) != 0 || futimens(fd, times) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    const int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

std::string FdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

// The key, then the chain: what gRPC reads as either file.
std::string IdentityText(const TlsFileContents& contents) {
  std::string text = contents.key;
  if (!text.empty() && text.back() != '\n') text.push_back('\n');
  return absl::StrCat(text, contents.cert);
}

}  // namespace

absl::StatusOr<TlsFileContents> ReadTlsFiles(const TlsFilePaths& paths) {
  TlsFileContents contents;
  absl::StatusOr<std::string> cert = ReadWhole("tls_cert", paths.cert_file);
  if (!cert.ok()) return cert.status();
  contents.cert = std::move(*cert);
  absl::StatusOr<std::string> key = ReadWhole("tls_key", paths.key_file);
  if (!key.ok()) return key.status();
  contents.key = std::move(*key);
  if (!paths.client_ca_file.empty()) {
    absl::StatusOr<std::string> roots = ReadWhole("tls_client_ca", paths.client_ca_file);
    if (!roots.ok()) return roots.status();
    contents.client_ca = std::move(*roots);
  }
  return contents;
}

absl::Status CheckTlsFiles(const TlsFilePaths& paths, const TlsFileContents& contents,
                           bool refuse_outdated) {
  if (absl::Status s = NeedsBlock("tls_cert", paths.cert_file, contents.cert, "CERTIFICATE");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = NeedsBlock("tls_key", paths.key_file, contents.key, "PRIVATE KEY");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckCertificateAndKey(paths, contents, refuse_outdated); !s.ok()) {
    return s;
  }
  if (paths.client_ca_file.empty()) return absl::OkStatus();
  if (absl::Status s =
          NeedsBlock("tls_client_ca", paths.client_ca_file, contents.client_ca, "CERTIFICATE");
      !s.ok()) {
    return s;
  }
  std::vector<X509*> roots = ParseCertificates(contents.client_ca);
  if (roots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_client_ca=", paths.client_ca_file,
                                                   ": a certificate in it does not parse"));
  }
  for (X509* root : roots) X509_free(root);
  return absl::OkStatus();
}

CheckedTlsFiles::CheckedTlsFiles(TlsFilePaths paths, absl::Duration interval)
    : paths_(std::move(paths)), interval_(interval), served_(paths_) {}

absl::StatusOr<std::unique_ptr<CheckedTlsFiles>> CheckedTlsFiles::Open(const TlsFilePaths& paths,
                                                                       absl::Duration interval) {
  absl::StatusOr<TlsFileContents> contents = ReadTlsFiles(paths);
  if (!contents.ok()) return contents.status();
  if (absl::Status s = CheckTlsFiles(paths, *contents, /*refuse_outdated=*/false); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTlsFiles(paths, *contents, /*refuse_outdated=*/true); !s.ok()) {
    // Served all the same (a certificate that expired while the daemon was
    // down must not keep it down: a renewal replaces it while it runs), but
    // every client that checks it will refuse it.
    Log(LogLevel::kWarning, "TLS: ", s.message(),
        "; served anyway, but clients refuse it: replace the files (re-read every "
        "--tls_reload_interval)");
  }
  std::unique_ptr<CheckedTlsFiles> files(new CheckedTlsFiles(paths, interval));
  absl::MutexLock lock(&files->mu_);
  files->staged_mtime_ = absl::ToUnixSeconds(absl::Now());
  const int64_t mtime = files->staged_mtime_;
  files->identity_fd_ = SealedCopy("optstated-tls-identity", IdentityText(*contents), mtime);
  if (!paths.client_ca_file.empty()) {
    files->client_ca_fd_ = SealedCopy("optstated-tls-client-ca", contents->client_ca, mtime);
  }
  const bool copied = files->identity_fd_ >= 0 &&
                      (paths.client_ca_file.empty() || files->client_ca_fd_ >= 0) &&
                      access(FdPath(files->identity_fd_).c_str(), R_OK) == 0;
  files->staged_not_after_ = NotAfterUnix(contents->cert);
  if (!copied) {
    Log(LogLevel::kWarning, "TLS: no checked copies of the files (memfd_create or /proc/self/fd: ",
        std::strerror(errno),
        "); gRPC reads --tls_cert, --tls_key and --tls_client_ca "
        "themselves, so a bad replacement fails new handshakes until the files are fixed");
    for (int* fd : {&files->identity_fd_, &files->client_ca_fd_}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
    return files;
  }
  // One copy for both: gRPC reads the key and the chain from it apart, each
  // skipping the other's PEM blocks, and one dup3 replaces both at once.
  files->served_.cert_file = FdPath(files->identity_fd_);
  files->served_.key_file = FdPath(files->identity_fd_);
  if (files->client_ca_fd_ >= 0) files->served_.client_ca_file = FdPath(files->client_ca_fd_);
  files->staged_ = std::move(*contents);
  files->watcher_ = std::thread([raw = files.get()] { raw->Watch(); });
  return files;
}

CheckedTlsFiles::~CheckedTlsFiles() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  for (int fd : {identity_fd_, client_ca_fd_}) {
    if (fd >= 0) close(fd);
  }
}

void CheckedTlsFiles::Watch() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) return;
    }
    LookNow().IgnoreError();  // Logged there.
  }
}

absl::Status CheckedTlsFiles::Stage(const TlsFileContents& contents) {
  // At least a second past the set served now: gRPC compares whole seconds.
  const int64_t mtime = std::max(absl::ToUnixSeconds(absl::Now()), staged_mtime_ + 1);
  const int identity = SealedCopy("optstated-tls-identity", IdentityText(contents), mtime);
  const int roots = identity >= 0 && client_ca_fd_ >= 0
                        ? SealedCopy("optstated-tls-client-ca", contents.client_ca, mtime)
                        : -1;
  const bool made = identity >= 0 && (client_ca_fd_ < 0 || roots >= 0);
  const int saved = errno;
  // dup3 replaces each descriptor gRPC reads in one step: the key and the
  // chain together, the roots (read apart from them) after.
  const bool swapped = made && dup3(identity, identity_fd_, O_CLOEXEC) >= 0 &&
                       (client_ca_fd_ < 0 || dup3(roots, client_ca_fd_, O_CLOEXEC) >= 0);
  const int swap_errno = errno;
  for (int fd : {identity, roots}) {
    if (fd >= 0) close(fd);
  }
  if (!made || !swapped) {
    return absl::InternalError(absl::StrCat("the daemon could not copy the TLS files: ",
                                            std::strerror(made ? swap_errno : saved)));
  }
  staged_ = contents;
  staged_not_after_ = NotAfterUnix(contents.cert);
  staged_mtime_ = mtime;
  return absl::OkStatus();
}

CheckedTlsFiles::Served CheckedTlsFiles::served() const {
  absl::MutexLock lock(&mu_);
  Served served;
  served.not_after_unix = staged_not_after_;
  served.files_refused = refusing_;
  return served;
}

absl::Status CheckedTlsFiles::LookNow() {
  absl::StatusOr<TlsFileContents> contents = ReadTlsFiles(paths_);
  absl::MutexLock lock(&mu_);
  absl::Status verdict = contents.status();
  if (verdict.ok()) {
    if (*contents == staged_) {
      if (refused_logged_) {
        // The refusal logged at ERROR is over: the files are the served ones again.
        Log(LogLevel::kInfo,
            "TLS: the files are those served again; the refusal of the changed ones is over");
      }
      refused_.clear();
      refused_logged_ = false;
      refusing_ = false;
      return absl::OkStatus();
    }
    verdict = CheckTlsFiles(paths_, *contents, /*refuse_outdated=*/true);
    if (verdict.ok() && identity_fd_ >= 0) {
      // Named before Stage replaces staged_: what changed.
      std::string changed;
      if (contents->cert != staged_.cert) changed = absl::StrCat("--tls_cert=", paths_.cert_file);
      if (contents->key != staged_.key) {
        absl::StrAppend(&changed, changed.empty() ? "" : ", ", "--tls_key=", paths_.key_file);
      }
      if (contents->client_ca != staged_.client_ca) {
        absl::StrAppend(&changed, changed.empty() ? "" : ", ",
                        "--tls_client_ca=", paths_.client_ca_file);
      }
      verdict = Stage(*contents);
      if (verdict.ok()) {
        Log(LogLevel::kInfo, "TLS: ", changed,
            " changed; new connections get the new files (open ones keep theirs)");
        refused_.clear();
        refused_logged_ = false;
        refusing_ = false;
        return absl::OkStatus();
      }
    }
    if (verdict.ok()) return verdict;  // No copies: gRPC reads the files themselves.
  }
  std::string refused(verdict.message());
  if (contents.ok()) absl::StrAppend(&refused, contents->cert, contents->key, contents->client_ca);
  if (refused != refused_) {
    // Seen once: a replacement may be under way (one file renamed, not yet
    // the other).
    refused_ = std::move(refused);
    refused_logged_ = false;
  } else if (!refused_logged_) {
    Log(LogLevel::kError,
        "TLS: the files are not served, new connections keep the previous "
        "ones until they are fixed: ",
        verdict.message());
    refused_logged_ = true;
    refusing_ = true;
  }
  return verdict;
}

}  // namespace optstate
