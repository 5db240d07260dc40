#include "server/generate_reactor.h"

#include <utility>

#include "base/check.h"
#include "server/executor.h"
#include "server/grpc_status.h"
#include "server/inference_service.h"
#include "server/wire_field.h"

namespace prefixd {
namespace {

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

GenerateReactor* GenerateReactor::Start(InferenceService* service,
                                        grpc::CallbackServerContext* context,
                                        const v1::GenerateRequest* request) {
  service->GenerateStarted();
  auto* reactor = new GenerateReactor(service, request);
  reactor->Begin(context);
  return reactor;
}

GenerateReactor::GenerateReactor(InferenceService* service, const v1::GenerateRequest* request)
    : service_(service), request_(request), link_(std::make_shared<Link>()) {
  absl::MutexLock l(&link_->mu);
  link_->reactor = this;
}

void GenerateReactor::FinishCall(const grpc::Status& status) {
  service_->path().FinishGenerate(Api::kGrpc, adapter_label_,
                                  static_cast<absl::StatusCode>(status.error_code()));
  Finish(status);  // `this` may be deleted from here on
}

void GenerateReactor::Begin(grpc::CallbackServerContext* context) {
  context_ = context;
  deadline_ = context->deadline();
  GenerateCall call = ToGenerateCall(*request_);
  call.authorization = AuthorizationOf(*context);
  absl::StatusOr<StartedGenerate> started = service_->path().StartGenerate(call);
  if (!started.ok()) {
    {
      absl::MutexLock l(&mu_);
      finished_ = true;
    }
    // Counted by the request path already: this call never started. A rule's refusal names
    // its field as the proto does.
    Finish(ToGrpcStatus(NameRequestField(
        started.status(), [this](RequestField f) { return GrpcFieldName(f, *request_); })));
    return;
  }
  request_id_ = started->request_id;
  adapter_label_ = started->adapter_label;
  top_logprobs_ = started->top_logprobs;
  {
    absl::MutexLock l(&mu_);
    output_.emplace(service_->path().tokenizer(), started->num_samples, started->stop);
  }
  stream_ = std::move(started->stream);
  std::weak_ptr<Link> weak = link_;
  Executor* pumps = service_->pumps();
  // Runs on the engine thread, which may only schedule work (engine/request_stream.h). A pump
  // clears pump_queued before it polls, so events pushed after that post a new one.
  // SetNotify fires at once when events are already waiting, so no pump is needed here.
  stream_->SetNotify([weak, pumps] {
    std::shared_ptr<Link> link = weak.lock();
    if (!link || link->pump_queued.exchange(true)) return;
    pumps->Post([weak] {
      std::shared_ptr<Link> link = weak.lock();
      if (!link) return;
      link->pump_queued.store(false);
      absl::MutexLock l(&link->mu);
      if (link->reactor != nullptr) link->reactor->Pump();
    });
  });
}

void GenerateReactor::SetUsageLocked() {
  const Usage u = output_->usage();
  v1::Usage* usage = msg_.mutable_usage();
  usage->set_prompt_tokens(u.prompt_tokens);
  usage->set_cached_prompt_tokens(u.cached_prompt_tokens);
  usage->set_cached_pool_tokens(u.cached_prompt_tokens - u.cached_disk_tokens -
                                u.cached_remote_tokens);
  usage->set_cached_disk_tokens(u.cached_disk_tokens);
  usage->set_cached_remote_tokens(u.cached_remote_tokens);
  usage->set_cached_retained_tokens(u.cached_retained_tokens);
  if (!request_->prompt_cache_key().empty()) {
    usage->set_prompt_cache_key(request_->prompt_cache_key());
  }
  usage->set_completion_tokens(u.completion_tokens);
  usage_sent_ = true;
}

bool GenerateReactor::BuildMessageLocked() {
  msg_.Clear();
  msg_.set_request_id(request_id_);
  std::vector<PromptToken> prompt;
  if (output_->TakePrompt(&prompt)) {
    msg_.set_sample_index(0);
    for (const PromptToken& p : prompt) {
      msg_.add_prompt_token_ids(p.token_id);
      if (!p.has_logprob) continue;
      msg_.add_prompt_logprobs(p.logprob);
      v1::TopLogprobs* top = msg_.add_prompt_top_logprobs();
      for (const TokenLogprob& e : p.top) {
        top->add_token_ids(e.token_id);
        top->add_logprobs(e.logprob);
      }
    }
    return true;
  }
  SampleOutput out;
  if (output_->Next(&out)) {
    // Everything ready for one sample, up to and including its end.
    msg_.set_sample_index(out.sample_index);
    std::string text;
    for (OutputToken& t : out.tokens) {
      msg_.add_token_ids(t.token_id);
      msg_.add_logprobs(t.logprob);
      text += t.text;
      if (top_logprobs_ > 0) {
        v1::TopLogprobs* top = msg_.add_top_logprobs();
        for (const TokenLogprob& e : t.top) {
          top->add_token_ids(e.token_id);
          top->add_logprobs(e.logprob);
        }
      }
    }
    text += out.trailing_text;
    msg_.set_text(std::move(text));
    msg_.set_finish_reason(ToProto(out.finish_reason));
    // The stream's last message carries usage: fold it in when nothing else is left.
    if (output_->done() && output_->status().ok()) SetUsageLocked();
    return true;
  }
  if (output_->done() && output_->status().ok() && !usage_sent_) {
    SetUsageLocked();
    return true;
  }
  return false;
}

void GenerateReactor::Pump() {
  enum class Action { kWrite, kFinish } action;
  grpc::Status finish_status;
  {
    absl::MutexLock l(&mu_);
    if (finished_) return;
    // Taken in even while a write is in flight (a slow reader's may stay so): a sample that
    // met a stop string meanwhile must not be computed on to max_new_tokens. msg_ is not
    // touched here.
    if (!output_->done()) {
      std::vector<RequestEvent> events;
      if (stream_->Poll(&events)) output_->Add(std::move(events));
      // A sample that met a stop string: the engine stops computing it.
      for (uint32_t sample : output_->StoppedSamples()) stream_->StopSample(sample);
    }
    if (write_in_flight_) return;
    if (cancelled_) {
      finished_ = true;
      action = Action::kFinish;
      // gRPC does not say why a call was cancelled. The client's own timer usually fires
      // first, and its cancel arrives before this side's deadline by about the time the
      // request took to get here (this side counts the timeout from arrival), hence the
      // margin; a client that cancels itself that close to its deadline is counted as a
      // deadline too.
      finish_status =
          std::chrono::system_clock::now() + std::chrono::milliseconds(250) >= deadline_
              ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the call's deadline passed")
              : grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
    } else if (BuildMessageLocked()) {
      write_in_flight_ = true;
      ArmWriteTimeoutLocked(++writes_);
      action = Action::kWrite;
    } else if (output_->done()) {
      finished_ = true;
      action = Action::kFinish;
      finish_status = ToGrpcStatus(output_->status());
    } else {
      return;
    }
  }
  // msg_ is not touched again until OnWriteDone, so StartWrite may read it unlocked.
  if (action == Action::kWrite) {
    StartWrite(&msg_);
  } else {
    FinishCall(finish_status);
  }
}

void GenerateReactor::ArmWriteTimeoutLocked(uint64_t write) {
  // Replacing the last write's alarm cancels it if it has not fired; its callback then sees
  // `fired` false. The callback holds no pointer to this reactor, only the Link.
  write_alarm_ = std::make_unique<grpc::Alarm>();
  // It runs on a gRPC thread and reaches the reactor as a pump does, through the Link.
  std::weak_ptr<Link> weak = link_;
  write_alarm_->Set(
      std::chrono::system_clock::now() +
          std::chrono::milliseconds(absl::ToInt64Milliseconds(service_->write_timeout())),
      [weak, write](bool fired) {
        if (!fired) return;
        std::shared_ptr<Link> link = weak.lock();
        if (!link) return;
        absl::MutexLock l(&link->mu);
        if (link->reactor != nullptr) link->reactor->OnWriteTimeout(write);
      });
}

void GenerateReactor::OnWriteTimeout(uint64_t write) {
  {
    absl::MutexLock l(&mu_);
    if (finished_ || !write_in_flight_ || writes_ != write) return;
  }
  // The write in flight then fails (OnWriteDone(false)), which cancels the engine stream and
  // finishes the call as cancelled; OnCancel follows.
  context_->TryCancel();
}

void GenerateReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock l(&mu_);
    write_in_flight_ = false;
    write_alarm_.reset();  // cancels it
    if (!ok) cancelled_ = true;
  }
  if (!ok) stream_->Cancel();
  Pump();
}

void GenerateReactor::OnCancel() {
  {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
  }
  if (stream_ != nullptr) stream_->Cancel();
  Pump();
}

void GenerateReactor::OnDone() {
  {
    absl::MutexLock l(&link_->mu);
    link_->reactor = nullptr;
  }
  if (stream_ != nullptr) stream_->Cancel();  // idempotent; a no-op after kDone
  InferenceService* service = service_;
  delete this;
  service->GenerateDone();
}

}  // namespace prefixd
