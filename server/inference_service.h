// prefixd.v1.Inference on gRPC's callback API. Every call is authenticated first (tenant →
// cache namespace), refused with UNAVAILABLE once draining has begun, and a Generate request
// is validated completely before anything is queued. Generate streams through a
// flow-controlled write reactor (see generate_reactor.h).
#ifndef PREFIXD_SERVER_INFERENCE_SERVICE_H_
#define PREFIXD_SERVER_INFERENCE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "grpcpp/grpcpp.h"
#include "prefixd/v1/inference.grpc.pb.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/validation.h"

namespace prefixd {

struct InferenceServiceOptions {
  Engine* engine = nullptr;              // not owned
  const Tokenizer* tokenizer = nullptr;  // not owned
  const Authenticator* auth = nullptr;   // not owned
  ServerMetrics* metrics = nullptr;      // not owned; may be null
  ValidationLimits limits;
  v1::ModelInfo model_info;  // fixed at start-up
};

class InferenceService final : public v1::Inference::CallbackService {
 public:
  explicit InferenceService(InferenceServiceOptions options);

  // From now on every new call gets UNAVAILABLE. Calls already running are not affected.
  void StartDraining() { draining_.store(true); }

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

  // Authentication and the draining check shared by every method: the caller's tenant, or
  // the status to finish the call with.
  absl::StatusOr<std::string> Admit(grpc::CallbackServerContext* context) const;

  // Generate calls whose reactor exists (started, OnDone not yet run).
  void GenerateStarted();
  void GenerateDone();
  // Waits until no Generate call is left or `timeout` passes; true if none is left.
  bool WaitForNoGenerates(absl::Duration timeout);

  const InferenceServiceOptions& options() const { return options_; }
  std::string NextRequestId();

 private:
  InferenceServiceOptions options_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_request_id_{1};
  absl::Mutex calls_mu_;
  int64_t live_generates_ ABSL_GUARDED_BY(calls_mu_) = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_INFERENCE_SERVICE_H_
