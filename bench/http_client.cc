#include "bench/http_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace prefixd::bench {
namespace {

absl::Status Unavailable(const std::string& what) {
  const int e = errno;
  return absl::UnavailableError(e != 0 ? absl::StrCat(what, ": ", std::strerror(e)) : what);
}

// Splits decoded body bytes into Server-Sent Events ("data: x\n\n") for the callback.
class EventSplitter {
 public:
  explicit EventSplitter(const std::function<void(std::string_view)>& on_event)
      : on_event_(on_event) {}
  void Add(std::string_view bytes) {
    pending_.append(bytes);
    size_t start = 0;
    for (size_t end; (end = pending_.find("\n\n", start)) != std::string::npos; start = end + 2) {
      // absl::string_view: Debian's absl has its own type, not std::string_view.
      absl::string_view event(pending_.data() + start, end - start);
      if (absl::ConsumePrefix(&event, "data:")) {
        absl::ConsumePrefix(&event, " ");
        on_event_(std::string_view(event.data(), event.size()));
      }
    }
    pending_.erase(0, start);
  }

 private:
  const std::function<void(std::string_view)>& on_event_;
  std::string pending_;
};

}  // namespace

HttpConnection::HttpConnection(std::string address) : address_(std::move(address)) {}

HttpConnection::~HttpConnection() { Close(); }

void HttpConnection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buffer_.clear();
  pos_ = 0;
}

absl::Status HttpConnection::Connect() {
  const size_t colon = address_.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(address_, " is not HOST:PORT"));
  }
  const std::string host = address_.substr(0, colon);
  const std::string port = address_.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  errno = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd_ = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd_ < 0) continue;
    if (::connect(fd_, a->ai_addr, a->ai_addrlen) == 0) break;
    ::close(fd_);
    fd_ = -1;
  }
  ::freeaddrinfo(found);
  if (fd_ < 0) return Unavailable(absl::StrCat("cannot connect to ", address_));
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return absl::OkStatus();
}

bool HttpConnection::Fill() {
  if (pos_ > 0 && pos_ == buffer_.size()) {
    buffer_.clear();
    pos_ = 0;
  }
  char chunk[16384];
  ssize_t n;
  errno = 0;  // a closed connection (n == 0) leaves errno as it was
  do {
    n = ::recv(fd_, chunk, sizeof(chunk), 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  buffer_.append(chunk, static_cast<size_t>(n));
  return true;
}

absl::StatusOr<std::string> HttpConnection::ReadLine() {
  for (;;) {
    const size_t eol = buffer_.find("\r\n", pos_);
    if (eol != std::string::npos) {
      std::string line = buffer_.substr(pos_, eol - pos_);
      pos_ = eol + 2;
      return line;
    }
    if (!Fill()) return Unavailable(absl::StrCat("connection to ", address_, " closed"));
  }
}

absl::Status HttpConnection::SendAndReadHead(const std::string& method, const std::string& path,
                                             const std::string& body,
                                             const std::map<std::string, std::string>& headers,
                                             HttpResponse* res, bool* retry) {
  *retry = false;
  const bool fresh = fd_ < 0;
  if (fresh) {
    if (absl::Status s = Connect(); !s.ok()) return s;
  }
  std::string request = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", address_, "\r\n");
  bool has_type = false;
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&request, name, ": ", value, "\r\n");
    has_type = has_type || absl::AsciiStrToLower(name) == "content-type";
  }
  if (!body.empty() || method == "POST") {
    if (!has_type) absl::StrAppend(&request, "Content-Type: application/json\r\n");
    absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  for (size_t off = 0; off < request.size();) {
    const ssize_t n = ::send(fd_, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may have answered already (413): read on
    off += static_cast<size_t>(n);
  }
  absl::StatusOr<std::string> status_line = ReadLine();
  if (!status_line.ok()) {
    Close();
    // A kept-alive connection the server has closed meanwhile: nothing was processed.
    *retry = !fresh;
    return status_line.status();
  }
  // "HTTP/1.1 200 OK"
  if (status_line->size() < 12 || !absl::SimpleAtoi(status_line->substr(9, 3), &res->status)) {
    Close();
    return absl::InternalError(absl::StrCat("bad status line: ", *status_line));
  }
  for (;;) {
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) {
      Close();
      return line.status();
    }
    if (line->empty()) return absl::OkStatus();
    const size_t colon = line->find(':');
    if (colon == std::string::npos) continue;
    res->headers[absl::AsciiStrToLower(line->substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line->substr(colon + 1)));
  }
}

absl::StatusOr<HttpResponse> HttpConnection::Post(
    const std::string& path, const std::string& body,
    const std::function<void(std::string_view)>& on_event) {
  return Send("POST", path, body, {}, on_event);
}

absl::StatusOr<HttpResponse> HttpConnection::Send(
    const std::string& method, const std::string& path, const std::string& body,
    const std::map<std::string, std::string>& headers,
    const std::function<void(std::string_view)>& on_event) {
  HttpResponse res;
  for (int attempt = 0;; ++attempt) {
    res = HttpResponse();
    bool retry = false;
    absl::Status head = SendAndReadHead(method, path, body, headers, &res, &retry);
    if (head.ok()) break;
    if (!retry || attempt > 0) return head;
  }
  const bool events = on_event && res.headers["content-type"].rfind("text/event-stream", 0) == 0;
  EventSplitter splitter(on_event);
  auto deliver = [&](std::string_view bytes) {
    if (events) {
      splitter.Add(bytes);
    } else {
      res.body.append(bytes);
    }
  };
  // Reads exactly `n` bytes of body.
  auto read_n = [&](size_t n) -> absl::Status {
    while (n > 0) {
      if (pos_ == buffer_.size() && !Fill()) {
        return Unavailable(absl::StrCat("connection to ", address_, " closed mid-response"));
      }
      const size_t take = std::min(n, buffer_.size() - pos_);
      deliver(std::string_view(buffer_).substr(pos_, take));
      pos_ += take;
      n -= take;
    }
    return absl::OkStatus();
  };
  absl::Status read_status;
  if (method == "HEAD" || res.status == 204 || res.status == 304) {
    // No body, whatever the headers say.
  } else if (absl::AsciiStrToLower(res.headers["transfer-encoding"]) == "chunked") {
    for (;;) {
      absl::StatusOr<std::string> size_line = ReadLine();
      if (!size_line.ok()) {
        read_status = size_line.status();
        break;
      }
      size_t size = 0;
      if (!absl::SimpleHexAtoi(size_line->substr(0, size_line->find(';')), &size)) {
        read_status = absl::InternalError(absl::StrCat("bad chunk size: ", *size_line));
        break;
      }
      if (size == 0) {  // trailers, then an empty line
        for (;;) {
          absl::StatusOr<std::string> t = ReadLine();
          if (!t.ok() || t->empty()) {
            if (!t.ok()) read_status = t.status();
            break;
          }
        }
        break;
      }
      if (read_status = read_n(size); !read_status.ok()) break;
      absl::StatusOr<std::string> crlf = ReadLine();
      if (!crlf.ok()) {
        read_status = crlf.status();
        break;
      }
    }
  } else if (auto it = res.headers.find("content-length"); it != res.headers.end()) {
    size_t length = 0;
    if (!absl::SimpleAtoi(it->second, &length)) {
      read_status = absl::InternalError(absl::StrCat("bad Content-Length: ", it->second));
    } else {
      read_status = read_n(length);
    }
  } else {  // the body runs to the end of the connection
    while (pos_ < buffer_.size() || Fill()) {
      deliver(std::string_view(buffer_).substr(pos_));
      pos_ = buffer_.size();
    }
    Close();
  }
  if (!read_status.ok() || absl::AsciiStrToLower(res.headers["connection"]) == "close") Close();
  if (!read_status.ok()) return read_status;
  return res;
}

absl::StatusOr<HttpResponse> HttpFetch(int port, const std::string& method, const std::string& path,
                                       const std::string& body,
                                       const std::map<std::string, std::string>& headers) {
  HttpConnection connection(absl::StrCat("127.0.0.1:", port));
  std::map<std::string, std::string> all = headers;
  all.emplace("Connection", "close");
  return connection.Send(method, path, body, all);
}

HttpEventStream::HttpEventStream(int port) : connection_(absl::StrCat("127.0.0.1:", port)) {}

absl::StatusOr<std::unique_ptr<HttpEventStream>> HttpEventStream::Open(
    int port, const std::string& path, const std::string& body,
    const std::map<std::string, std::string>& headers) {
  std::unique_ptr<HttpEventStream> s(new HttpEventStream(port));
  std::map<std::string, std::string> all = headers;
  all.emplace("Connection", "close");
  bool retry = false;
  if (absl::Status head =
          s->connection_.SendAndReadHead("POST", path, body, all, &s->head_, &retry);
      !head.ok()) {
    return head;
  }
  s->chunked_ = absl::AsciiStrToLower(s->head_.headers["transfer-encoding"]) == "chunked";
  return s;
}

absl::StatusOr<std::unique_ptr<HttpEventStream>> HttpEventStream::SendOnly(
    int port, const std::string& path, const std::string& body,
    const std::map<std::string, std::string>& headers) {
  std::unique_ptr<HttpEventStream> s(new HttpEventStream(port));
  HttpConnection& c = s->connection_;
  if (absl::Status st = c.Connect(); !st.ok()) return st;
  std::string all = absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: ", c.address_,
                                 "\r\nConnection: close\r\nContent-Type: application/json\r\n");
  for (const auto& [name, value] : headers) absl::StrAppend(&all, name, ": ", value, "\r\n");
  absl::StrAppend(&all, "Content-Length: ", body.size(), "\r\n\r\n", body);
  for (size_t off = 0; off < all.size();) {
    const ssize_t n = ::send(c.fd_, all.data() + off, all.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Unavailable("send failed");
    off += static_cast<size_t>(n);
  }
  s->done_ = true;
  return s;
}

bool HttpEventStream::ReadBody() {
  HttpConnection& c = connection_;
  if (done_ || c.fd_ < 0) return false;
  if (!chunked_) {  // to the end of the connection (or its Content-Length, read whole)
    if (c.pos_ == c.buffer_.size() && !c.Fill()) {
      done_ = true;
      return false;
    }
    body_.append(c.buffer_, c.pos_, std::string::npos);
    c.pos_ = c.buffer_.size();
    return true;
  }
  absl::StatusOr<std::string> size_line = c.ReadLine();
  size_t size = 0;
  if (!size_line.ok() || !absl::SimpleHexAtoi(size_line->substr(0, size_line->find(';')), &size) ||
      size == 0) {
    done_ = true;
    return false;
  }
  while (c.buffer_.size() - c.pos_ < size + 2) {
    if (!c.Fill()) {
      done_ = true;
      return false;
    }
  }
  body_.append(c.buffer_, c.pos_, size);
  c.pos_ += size + 2;  // the chunk and its CRLF
  return true;
}

std::optional<std::string> HttpEventStream::Next() {
  for (;;) {
    const size_t end = body_.find("\n\n");
    if (end != std::string::npos) {
      std::string event = body_.substr(0, end);
      body_.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) return event.substr(6);
      continue;  // a comment or another field
    }
    if (!ReadBody()) return std::nullopt;
  }
}

}  // namespace prefixd::bench
