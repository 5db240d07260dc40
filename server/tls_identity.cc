#include "server/tls_identity.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace prefixd {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

// OpenSSL's reason for the last failure on this thread, and clears its queue.
std::string OpenSslReason() {
  const unsigned long e = ERR_peek_last_error();
  std::string reason = e != 0 ? ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "" : "";
  ERR_clear_error();
  return reason.empty() ? "" : absl::StrCat(" (OpenSSL: ", reason, ")");
}

std::unique_ptr<BIO, BioFree> MemBio(const std::string& data) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// Refuses to prompt for a pass phrase: an encrypted key is an error, not a terminal prompt.
int NoPassphrase(char*, int, int, void*) { return -1; }

// Writes `data` to `path` (mode 0600) atomically (base/file.h): gRPC's watcher reads the
// old file or the new one, never a part.
absl::Status WriteAtomically(const std::string& path, const std::string& data) {
  if (const int err = WriteFileAtomically(path + ".new", path, data, 0600); err != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

// How often gRPC's watcher re-reads the served copy: the longest a reload takes to reach
// new handshakes.
constexpr unsigned int kRefreshSeconds = 1;

}  // namespace

absl::Status CheckTlsPair(const std::string& cert_pem, const std::string& key_pem,
                          const std::string& cert_path, const std::string& key_path) {
  ERR_clear_error();
  auto cert_bio = MemBio(cert_pem);
  std::unique_ptr<X509, X509Free> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, NoPassphrase, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-cert ", cert_path,
        ": no PEM certificate in it (expected a \"-----BEGIN CERTIFICATE-----\" block)",
        OpenSslReason()));
  }
  // The rest of the file is the chain: each further block must be a certificate too.
  while (true) {
    std::unique_ptr<X509, X509Free> next(
        PEM_read_bio_X509(cert_bio.get(), nullptr, NoPassphrase, nullptr));
    if (next != nullptr) continue;
    const unsigned long e = ERR_peek_last_error();
    if (ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE) break;
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-cert ", cert_path,
        ": a block after the first certificate is not a valid certificate", OpenSslReason()));
  }
  ERR_clear_error();
  auto key_bio = MemBio(key_pem);
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassphrase, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key ", key_path,
        ": no readable PEM private key in it (expected an unencrypted \"-----BEGIN PRIVATE "
        "KEY-----\" or \"-----BEGIN EC/RSA PRIVATE KEY-----\" block)",
        OpenSslReason()));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls-key ", key_path,
                                                   " is not the private key of the certificate in "
                                                   "--tls-cert ",
                                                   cert_path, " (they do not belong together)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TlsIdentity>> TlsIdentity::Create(const std::string& cert_path,
                                                                 const std::string& key_path) {
  std::unique_ptr<TlsIdentity> id(new TlsIdentity());
  id->cert_path_ = cert_path;
  id->key_path_ = key_path;
  std::string dir_template = (std::filesystem::temp_directory_path() / "prefixd-tls-XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot make a private directory for the TLS key: ", strerror(errno)));
  }
  id->dir_ = dir_template;  // mkdtemp makes it 0700
  if (absl::Status s = id->ReadCheckAndServe(); !s.ok()) return s;
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      id->dir_ + "/key.pem", id->dir_ + "/cert.pem", kRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  id->credentials_ = grpc::experimental::TlsServerCredentials(options);
  if (id->credentials_ == nullptr) {
    return absl::InternalError("gRPC could not make TLS server credentials");
  }
  return id;
}

TlsIdentity::~TlsIdentity() {
  if (dir_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status TlsIdentity::ReadCheckAndServe() {
  absl::StatusOr<std::string> cert = ReadWholeFile(cert_path_);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadWholeFile(key_path_);
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckTlsPair(*cert, *key, cert_path_, key_path_); !s.ok()) return s;
  // Key first: the watcher reads both files and retries while either changes under it.
  if (absl::Status s = WriteAtomically(dir_ + "/key.pem", *key); !s.ok()) return s;
  return WriteAtomically(dir_ + "/cert.pem", *cert);
}

absl::Status TlsIdentity::Reload() { return ReadCheckAndServe(); }

}  // namespace prefixd
