// The server's TLS certificate chain and private key (--tls-cert, --tls-key), checked before
// they are served and swappable while serving.
//
// gRPC 1.51 has no certificate provider that a program can hand new PEMs to; its file
// watcher re-reads two files every second and uses whatever it finds. So the checked pair
// is written into a private directory (0700, removed with this object) that only this class
// writes, and the watcher reads that copy: a pair reaches gRPC only after it parsed and its
// key matched its certificate. Reload() re-reads the operator's files and, when they pass,
// replaces the copy; connections open at that moment keep their session, and new handshakes
// use the new pair within about a second.
#ifndef PREFIXD_SERVER_TLS_IDENTITY_H_
#define PREFIXD_SERVER_TLS_IDENTITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"

namespace prefixd {

// INVALID_ARGUMENT saying what is wrong with the pair (no PEM certificate in the file, no
// readable private key, a key that does not belong to the certificate), naming the flag and
// file. The paths only name the files in messages.
absl::Status CheckTlsPair(const std::string& cert_pem, const std::string& key_pem,
                          const std::string& cert_path, const std::string& key_path);

class TlsIdentity {
 public:
  // Reads and checks the pair and makes credentials that serve it.
  static absl::StatusOr<std::unique_ptr<TlsIdentity>> Create(const std::string& cert_path,
                                                             const std::string& key_path);
  ~TlsIdentity();

  TlsIdentity(const TlsIdentity&) = delete;
  TlsIdentity& operator=(const TlsIdentity&) = delete;

  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }

  // Re-reads the files given to Create. OK: new handshakes get the new pair within ~1 s.
  // Otherwise the pair served so far stays, and the error says why.
  absl::Status Reload();

 private:
  TlsIdentity() = default;
  // Reads and checks the operator's files, then replaces the served copy.
  absl::Status ReadCheckAndServe();

  std::string cert_path_;
  std::string key_path_;
  std::string dir_;  // the private copy the watcher reads
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_TLS_IDENTITY_H_
