#include "tests/server/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace prefixd::testing {
namespace {

absl::StatusOr<int> Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string err = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", err));
  }
  timeval tv{.tv_sec = 60, .tv_usec = 0};  // a hung server fails the test, not the run
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

absl::Status SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Reads into *buf until it holds `needle`; false at EOF first.
bool ReadUntil(int fd, std::string* buf, const std::string& needle) {
  char chunk[4096];
  while (buf->find(needle) == std::string::npos) {
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buf->append(chunk, static_cast<size_t>(n));
  }
  return true;
}

std::string Request(const std::string& method, const std::string& path, const std::string& body,
                    const std::map<std::string, std::string>& headers) {
  std::string req = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                 "Connection: close\r\n");
  bool has_type = false;
  for (const auto& [k, v] : headers) {
    absl::StrAppend(&req, k, ": ", v, "\r\n");
    has_type = has_type || k == "Content-Type";
  }
  if (!body.empty() || method == "POST") {
    if (!has_type) absl::StrAppend(&req, "Content-Type: application/json\r\n");
    absl::StrAppend(&req, "Content-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&req, "\r\n", body);
  return req;
}

// Parses "HTTP/1.1 200 OK\r\nName: value\r\n...\r\n\r\n" off the front of *buf.
bool ParseHead(std::string* buf, int* status, std::map<std::string, std::string>* headers) {
  const size_t end = buf->find("\r\n\r\n");
  if (end == std::string::npos) return false;
  const std::string head = buf->substr(0, end);
  buf->erase(0, end + 4);
  size_t pos = head.find("\r\n");
  const std::string status_line = head.substr(0, pos);
  const size_t sp = status_line.find(' ');
  if (sp == std::string::npos || !absl::SimpleAtoi(status_line.substr(sp + 1, 3), status)) {
    return false;
  }
  while (pos != std::string::npos) {
    const size_t next = head.find("\r\n", pos + 2);
    const std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos
                                                                             : next - pos - 2);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      (*headers)[name] = value;
    }
    pos = next;
  }
  return true;
}

// Moves complete chunks from *raw to *body; true once the last chunk was seen.
bool Dechunk(std::string* raw, std::string* body) {
  while (true) {
    const size_t eol = raw->find("\r\n");
    if (eol == std::string::npos) return false;
    size_t size = 0;
    const std::string hex = raw->substr(0, eol);
    size = std::stoul(hex, nullptr, 16);
    if (raw->size() < eol + 2 + size + 2) return false;
    body->append(*raw, eol + 2, size);
    raw->erase(0, eol + 2 + size + 2);
    if (size == 0) return true;
  }
}

}  // namespace

absl::StatusOr<HttpResponse> HttpFetch(int port, const std::string& method,
                                       const std::string& path, const std::string& body,
                                       const std::map<std::string, std::string>& headers) {
  absl::StatusOr<int> fd = Connect(port);
  if (!fd.ok()) return fd.status();
  absl::Status sent = SendAll(*fd, Request(method, path, body, headers));
  std::string buf;
  char chunk[4096];
  while (true) {  // Connection: close: the body ends with the connection
    const ssize_t n = recv(*fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
  }
  close(*fd);
  HttpResponse r;
  if (!ParseHead(&buf, &r.status, &r.headers)) {
    return absl::DataLossError(absl::StrCat("no HTTP response (", sent.ToString(), "): ", buf));
  }
  if (r.headers["transfer-encoding"] == "chunked") {
    if (!Dechunk(&buf, &r.body)) return absl::DataLossError("chunked body cut short");
  } else {
    r.body = buf;
  }
  return r;
}

absl::StatusOr<std::unique_ptr<HttpEventStream>> HttpEventStream::Open(
    int port, const std::string& path, const std::string& body,
    const std::map<std::string, std::string>& headers, bool read_head) {
  absl::StatusOr<int> fd = Connect(port);
  if (!fd.ok()) return fd.status();
  auto s = std::unique_ptr<HttpEventStream>(new HttpEventStream());
  s->fd_ = *fd;
  if (absl::Status st = SendAll(s->fd_, Request("POST", path, body, headers)); !st.ok()) return st;
  if (!read_head) return s;
  if (!ReadUntil(s->fd_, &s->raw_, "\r\n\r\n")) return absl::DataLossError("no response head");
  std::map<std::string, std::string> h;
  if (!ParseHead(&s->raw_, &s->status_, &h)) return absl::DataLossError("bad response head");
  s->chunked_ = h["transfer-encoding"] == "chunked";
  return s;
}

HttpEventStream::~HttpEventStream() { Abort(); }

void HttpEventStream::Abort() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

std::optional<std::string> HttpEventStream::Next() {
  while (true) {
    if (!body_done_) {
      if (chunked_) {
        if (Dechunk(&raw_, &body_)) body_done_ = true;
      } else {
        body_ += raw_;
        raw_.clear();
      }
    }
    const size_t end = body_.find("\n\n");
    if (end != std::string::npos) {
      std::string event = body_.substr(0, end);
      body_.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) return event.substr(6);
      continue;  // a comment or another field
    }
    if (body_done_ || fd_ < 0) return std::nullopt;
    char chunk[4096];
    const ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      body_done_ = true;
      continue;
    }
    raw_.append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace prefixd::testing
