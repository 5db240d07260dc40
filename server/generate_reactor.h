// The server-streaming reactor of one Generate call.
//
// Flow control: at most one write is in flight; events that arrive meanwhile queue up and
// are coalesced into the next message (all ready tokens of one sample, with its
// finish_reason when the sample ended; text and stop strings by server/generate_output.h). A slow
// client therefore gets fewer, larger messages instead of an unbounded send buffer. Events are
// taken in, and stop strings applied, while a write is in flight too, so a sample whose text meets
// a stop string stops in the engine even while its client is not reading.
//
// Threads: the engine thread's notify only posts a pump to the front end's executor
// (server/executor.h), at most one queued per call; the pump (polling the engine stream,
// text and stop strings, building the message, StartWrite) runs there or in gRPC's own
// reactions, never on the engine thread, so a slow or blocked call cannot delay a step.
//
// Lifetime: a posted pump reaches the reactor through a small shared Link whose pointer OnDone
// clears under the Link's mutex, so a pump that races with the end of the call never touches
// a deleted reactor. gRPC runs OnDone only after Finish and after any OnCancel / OnWriteDone
// reaction has returned.
//
// Cancellation: OnCancel (client cancel, disconnect, deadline) and a failed write cancel the
// engine stream at once, so the sequence's blocks are released before the engine's next step.
// A write the client takes none of for the service's write timeout (--response-write-timeout:
// the client stopped reading) cancels the call, so that it cannot hold its connection and the
// request's output for as long as the client lives: an alarm armed with each write reaches the
// reactor through the Link, as a pump does.
#ifndef PREFIXD_SERVER_GENERATE_REACTOR_H_
#define PREFIXD_SERVER_GENERATE_REACTOR_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/request_stream.h"
#include "engine/tokenizer.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "prefixd/v1/inference.grpc.pb.h"
#include "server/generate_output.h"

namespace prefixd {

class InferenceService;

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // Hands the call to the request path; on any refusal the call is finished at once.
  static GenerateReactor* Start(InferenceService* service, grpc::CallbackServerContext* context,
                                const v1::GenerateRequest* request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Link {
    absl::Mutex mu;
    GenerateReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    // A pump is posted and has not started: further notifies need not post another.
    std::atomic<bool> pump_queued{false};
  };

  GenerateReactor(InferenceService* service, const v1::GenerateRequest* request);
  void Begin(grpc::CallbackServerContext* context);
  // Decides the next step under mu_ and performs it (StartWrite or Finish) outside it.
  void Pump();
  // Builds the next message into msg_ (what one sample has ready, or the closing usage);
  // false if there is none yet.
  bool BuildMessageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetUsageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishCall(const grpc::Status& status);
  // Arms the write alarm for write number `write`.
  void ArmWriteTimeoutLocked(uint64_t write) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The alarm of write number `write` fired: cancels the call if that write is still in flight.
  void OnWriteTimeout(uint64_t write);

  InferenceService* const service_;
  grpc::CallbackServerContext* context_ = nullptr;  // set in Begin; valid until OnDone
  const v1::GenerateRequest* const request_;
  // The client's deadline (time_point::max() without one): a cancellation at or past it is
  // reported, and counted in the metrics, as DEADLINE_EXCEEDED rather than CANCELLED.
  std::chrono::system_clock::time_point deadline_ = std::chrono::system_clock::time_point::max();
  std::string request_id_;
  std::string adapter_label_;  // StartedGenerate::adapter_label
  uint32_t top_logprobs_ = 0;
  std::shared_ptr<Link> link_;
  std::shared_ptr<RequestStream> stream_;  // set once in Begin, before any notify

  absl::Mutex mu_;
  // Engine events turned into per-sample output (text, stop strings); set in Begin.
  std::optional<GenerateOutput> output_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse msg_ ABSL_GUARDED_BY(mu_);  // the message being written
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;  // writes started; names the one in flight
  std::unique_ptr<grpc::Alarm> write_alarm_ ABSL_GUARDED_BY(mu_);  // the last write's
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool usage_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish called or decided
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_GENERATE_REACTOR_H_
