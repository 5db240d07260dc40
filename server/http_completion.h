// One running POST /v1/completions, without any networking: a generation per prompt,
// started through the request path all or nothing, and what each choice has been sent. The
// HTTP session (server/http_session.h) owns it on its connection's strand, feeds it engine
// events, and writes what it returns: the whole response once every generation is done, or
// Server-Sent Events as tokens arrive. Not thread-safe: one strand calls it.
#ifndef PREFIXD_SERVER_HTTP_COMPLETION_H_
#define PREFIXD_SERVER_HTTP_COMPLETION_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/generate_output.h"
#include "server/openai_api.h"
#include "server/request_path.h"

namespace prefixd {

// A response: JSON (or an error in OpenAI's shape) unless `content_type` says otherwise.
struct HttpReply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  // A 405's Allow header: the methods the path takes (RFC 9110 15.5.6 requires it).
  std::string allow;
};

HttpReply ErrorReply(const absl::Status& status);

class HttpCompletion {
 public:
  // Starts every prompt's generation, or none: a refusal of any of them cancels those
  // already queued and is returned (with HTTP field names), every prompt of the request
  // then counted with the refusal's code. Each started generation is counted by the
  // request path once it ends (FinishGenerate), however it ends.
  static absl::StatusOr<std::unique_ptr<HttpCompletion>> Start(
      RequestPath& path, CompletionRequest request,
      const std::optional<std::string>& authorization);
  ~HttpCompletion();  // Abandon()

  HttpCompletion(const HttpCompletion&) = delete;
  HttpCompletion& operator=(const HttpCompletion&) = delete;

  bool streamed() const { return request_.stream; }

  // `notify` runs on the engine thread whenever a generation has events; it may only
  // schedule work (post Poll to the strand), never do it.
  void SetNotify(const std::function<void()>& notify);

  // Takes the engine's pending events, and tells the engine about samples that a stop
  // string ended.
  void Poll();

  // Not streamed: once every generation is done, the response (200, or the first error);
  // nullopt while some still run.
  std::optional<HttpReply> TakeWhole();

  // Streamed: the events ready to send (a chunk per sample output, an error event per
  // failed generation, and at the end the usage chunk when asked for, then [DONE]). *last is
  // set once everything has been returned.
  std::string TakeStreamBytes(bool* last);

  // Cancels the generations still running and counts them as CANCELLED (the client went
  // away, or the server stops). Idempotent; nothing is returned after it.
  void Abandon();

 private:
  struct Generation {
    StartedGenerate started;
    std::optional<GenerateOutput> output;
    bool counted = false;  // FinishGenerate called
  };

  HttpCompletion(RequestPath& path, CompletionRequest request);
  // Counts each generation once it is done; true when all are. Error events of failed
  // generations are appended to *error_events when it is not null.
  bool CountFinished(std::string* error_events);
  Usage TotalUsage() const;

  RequestPath& path_;
  CompletionRequest request_;
  ResponseHeader header_;
  std::vector<Generation> gens_;
  std::vector<Choice> choices_;  // non-streamed: the response; streamed: text sent so far
  uint32_t samples_ = 1;
  absl::Status first_error_;
  bool finished_ = false;  // the whole response or the last event was returned, or abandoned
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_COMPLETION_H_
