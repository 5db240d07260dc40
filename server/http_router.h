// Which endpoint an HTTP request is for, and what it gets, without any networking:
//
//   POST /v1/completions       a started HttpCompletion (server/http_completion.h)
//   GET  /v1/models            the served model
//   GET  /health               200 while serving, 503 while draining (needs no token)
//   POST /tokenize, /detokenize
//   POST /v1/chat/completions  400: GPT-2 is a base model without a chat template
//   POST /v1/load_lora_adapter, /v1/unload_lora_adapter (a load is deferred: it reads files)
//
// Every endpoint but /health authorizes the caller before its body is parsed, so a caller
// without a token learns nothing from how the body is read. Everything goes through the
// request path (server/request_path.h), like a gRPC call.
#ifndef PREFIXD_SERVER_HTTP_ROUTER_H_
#define PREFIXD_SERVER_HTTP_ROUTER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "server/http_completion.h"
#include "server/http_handler.h"
#include "server/request_path.h"

namespace prefixd {

class HttpRouter : public HttpHandler {
 public:
  // `path` is not owned and outlives the router; `created` is the time /v1/models reports.
  HttpRouter(RequestPath* path, int64_t created) : path_(*path), created_(created) {}

  HttpRouted Route(const HttpRequestView& request) override;

 private:
  HttpRouted Completions(const HttpRequestView& request);
  HttpReply Models(const HttpRequestView& request);
  HttpRouted LoadLoraAdapter(const HttpRequestView& request);
  HttpReply UnloadLoraAdapter(const HttpRequestView& request);
  HttpReply Tokenize(const HttpRequestView& request);
  HttpReply Detokenize(const HttpRequestView& request);

  RequestPath& path_;
  const int64_t created_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_ROUTER_H_
