#include "client/call/tls_files.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace optstate::client_internal {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

// The option as C++ and Python name it, for messages.
std::string OptionName(const char* cpp, const char* python) {
  return absl::StrCat("ClientOptions.", cpp, " (Python: ", python, "=)");
}

absl::StatusOr<std::string> ReadWhole(const std::string& option, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(option, " '", path, "' cannot be read"));
  }
  return text.str();
}

std::unique_ptr<BIO, BioFree> BioOf(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of `pem`, or null.
std::unique_ptr<X509, X509Free> FirstCertificate(const std::string& pem) {
  auto bio = BioOf(pem);
  return std::unique_ptr<X509, X509Free>(
      bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

}  // namespace

absl::StatusOr<TlsPem> ReadTlsFiles(const ClientOptions& options) {
  TlsPem pem;
  if (!options.tls_root_ca_file.empty()) {
    const std::string option = OptionName("tls_root_ca_file", "tls_root_ca");
    absl::StatusOr<std::string> text = ReadWhole(option, options.tls_root_ca_file);
    if (!text.ok()) return text.status();
    if (!FirstCertificate(*text)) {
      return absl::InvalidArgumentError(
          absl::StrCat(option, " '", options.tls_root_ca_file,
                       "' holds no PEM certificate (BEGIN CERTIFICATE): give the CA's "
                       "certificate that signed the daemon's, not a key or a request"));
    }
    pem.root_certs = *std::move(text);
  }
  if (options.tls_cert_file.empty()) return pem;
  const std::string cert_option = OptionName("tls_cert_file", "tls_cert");
  const std::string key_option = OptionName("tls_key_file", "tls_key");
  absl::StatusOr<std::string> cert_text = ReadWhole(cert_option, options.tls_cert_file);
  if (!cert_text.ok()) return cert_text.status();
  absl::StatusOr<std::string> key_text = ReadWhole(key_option, options.tls_key_file);
  if (!key_text.ok()) return key_text.status();
  std::unique_ptr<X509, X509Free> cert = FirstCertificate(*cert_text);
  if (!cert) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_option, " '", options.tls_cert_file,
                     "' holds no PEM certificate (BEGIN CERTIFICATE): give this client's "
                     "certificate there and its key as ",
                     key_option));
  }
  auto key_bio = BioOf(*key_text);
  // No password: OpenSSL's default callback would prompt on the terminal (or
  // block reading stdin), and gRPC takes no encrypted key either.
  pem_password_cb* no_password = [](char*, int, int, void*) { return 0; };
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_password, nullptr) : nullptr);
  if (!key) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_option, " '", options.tls_key_file,
                     "' holds no unencrypted PEM private key (BEGIN PRIVATE KEY): give the key of ",
                     cert_option));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_option, " '", options.tls_key_file, "' is not the key of the certificate in ",
        cert_option, " '", options.tls_cert_file, "' (its first certificate)"));
  }
  pem.cert_chain = *std::move(cert_text);
  pem.private_key = *std::move(key_text);
  return pem;
}

}  // namespace optstate::client_internal
