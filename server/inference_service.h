// The gRPC front end: prefixd.v1.Inference on gRPC's callback API. Each method translates
// its request into the request path's terms (server/request_path.h), and the result back;
// a Status maps 1:1 onto a gRPC status (server/grpc_status.h). Generate streams through a
// flow-controlled write reactor (server/generate_reactor.h).
#ifndef PREFIXD_SERVER_INFERENCE_SERVICE_H_
#define PREFIXD_SERVER_INFERENCE_SERVICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "prefixd/v1/inference.grpc.pb.h"
#include "server/request_path.h"

namespace prefixd {

class Executor;

class InferenceService final : public v1::Inference::CallbackService {
 public:
  // `pumps` runs the Generate reactors' pumps (server/generate_reactor.h); both outlive every
  // call. A Generate call whose client takes none of a message for `write_timeout` is
  // cancelled.
  InferenceService(RequestPath* path, Executor* pumps,
                   absl::Duration write_timeout = absl::Seconds(60))
      : path_(path), pumps_(pumps), write_timeout_(write_timeout) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetCacheStats(grpc::CallbackServerContext* context,
                                          const v1::GetCacheStatsRequest* request,
                                          v1::CacheStats* response) override;
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const v1::LoadLoraAdapterRequest* request,
                                            v1::AdapterInfo* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const v1::UnloadLoraAdapterRequest* request,
                                              v1::UnloadLoraAdapterResponse* response) override;

  // Generate calls whose reactor exists (started, OnDone not yet run).
  void GenerateStarted();
  void GenerateDone();
  // Waits until no Generate call is left or `timeout` passes; true if none is left.
  bool WaitForNoGenerates(absl::Duration timeout);

  RequestPath& path() { return *path_; }
  Executor* pumps() { return pumps_; }
  absl::Duration write_timeout() const { return write_timeout_; }

 private:
  friend class ServerTestPeer;  // tests/server/server_test_peer.h
  int64_t live_generates() const;

  RequestPath* const path_;  // not owned
  Executor* const pumps_;    // not owned
  const absl::Duration write_timeout_;
  mutable absl::Mutex calls_mu_;
  int64_t live_generates_ ABSL_GUARDED_BY(calls_mu_) = 0;
};

// The call's `authorization` metadata, if it carried one.
std::optional<std::string> AuthorizationOf(const grpc::CallbackServerContext& context);

// A GenerateRequest as the request path takes it: each field into the engine's request or
// the call, and proto3's unset values read as inference.proto says (num_samples 0 is 1;
// top_p, repetition_penalty and seed unset are 1, 1 and one the server draws; no prompt is
// an empty one). It checks no rule: the request path and the engine do
// (engine/request_validation.h), after the caller is authenticated.
GenerateCall ToGenerateCall(const v1::GenerateRequest& request);
// GenerateRequest's name for a request field: the proto field's. The prompt's is
// `token_ids` when the request set them, else `text`.
std::string_view GrpcFieldName(RequestField field, const v1::GenerateRequest& request);

// The proto forms of what the request path returns.
void ToProto(const ServedModel& model, v1::ModelInfo* out);
void ToProto(const EngineStats& stats, v1::CacheStats* out);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_INFERENCE_SERVICE_H_
