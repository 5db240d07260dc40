#include "server/kv_events.h"

#include <algorithm>
#include <exception>
#include <iterator>
#include <optional>
#include <utility>

#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/check.h"

namespace prefixd {

struct KvEventPublisher::Sockets {
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  zmq::socket_t replay;  // unbound (null) without --kv-events-replay
  // sent batches, oldest first: (seq, payload)
  std::deque<std::pair<uint64_t, std::string>> buffer;
};

namespace {

// The publisher thread waits this long for a batch before it looks at the replay socket.
// Replay requests are answered within this delay; batches wake it at once.
constexpr absl::Duration kReplayPoll = absl::Milliseconds(20);

bool HasTransport(const std::string& endpoint) {
  for (const char* t : {"tcp://", "ipc://", "inproc://"}) {
    if (absl::StartsWith(endpoint, t) && endpoint.size() > std::string(t).size()) return true;
  }
  return false;
}

std::string BigEndian8(int64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(static_cast<uint64_t>(v) & 0xff);
    v = static_cast<int64_t>(static_cast<uint64_t>(v) >> 8);
  }
  return out;
}

int64_t FromBigEndian8(const zmq::message_t& m) {
  uint64_t v = 0;
  const auto* p = static_cast<const unsigned char*>(m.data());
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return static_cast<int64_t>(v);
}

// Writes an event's fields in vLLM's declaration order, the type first: named (a map) or
// positional (an array). Every field is written, as vLLM writes these (none of them has a
// default it would omit).
class EventPacker {
 public:
  EventPacker(msgpack::packer<msgpack::sbuffer>& pk, KvEventEncoding encoding)
      : pk_(pk), map_(encoding == KvEventEncoding::kMap) {}
  // Starts an event of `fields` fields besides its type.
  void Begin(const char* type, uint32_t fields) {
    if (map_) {
      pk_.pack_map(fields + 1);
      pk_.pack(std::string("type"));
    } else {
      pk_.pack_array(fields + 1);
    }
    pk_.pack(std::string(type));
  }
  // Before each field's value.
  msgpack::packer<msgpack::sbuffer>& Field(const char* name) {
    if (map_) pk_.pack(std::string(name));
    return pk_;
  }

 private:
  msgpack::packer<msgpack::sbuffer>& pk_;
  const bool map_;
};

void PackStored(EventPacker& ep, const KvBlockStored& s) {
  ep.Begin("BlockStored", 8);
  ep.Field("block_hashes").pack_array(1).pack_uint64(s.block_hash);
  auto& parent = ep.Field("parent_block_hash");
  if (s.parent_block_hash.has_value()) {
    parent.pack_uint64(*s.parent_block_hash);
  } else {
    parent.pack_nil();
  }
  auto& tokens = ep.Field("token_ids");
  tokens.pack_array(static_cast<uint32_t>(s.token_ids.size()));
  for (uint32_t t : s.token_ids) tokens.pack_uint32(t);
  ep.Field("block_size").pack_int32(s.block_size);
  auto& lora_id = ep.Field("lora_id");
  if (s.lora_id.has_value()) {
    lora_id.pack_int64(*s.lora_id);
  } else {
    lora_id.pack_nil();
  }
  ep.Field("medium").pack(std::string(KvMediumName(s.medium)));
  auto& lora_name = ep.Field("lora_name");
  if (s.lora_name.has_value()) {
    lora_name.pack(*s.lora_name);
  } else {
    lora_name.pack_nil();
  }
  // One entry per block in block_hashes (vLLM: list[tuple | None]).
  auto& extra = ep.Field("extra_keys");
  extra.pack_array(1);
  extra.pack_array(static_cast<uint32_t>(s.extra_keys.size()));
  for (const std::string& k : s.extra_keys) extra.pack(k);
}

int MediumKey(KvMedium m) { return static_cast<int>(m); }

}  // namespace

absl::Status ValidateKvEventsOptions(const KvEventsOptions& o) {
  if (o.encoding != "map" && o.encoding != "array") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-events-encoding must be map (vLLM's current wire) or array (its earlier one), "
        "got '", o.encoding, "'"));
  }
  if (o.endpoint.empty()) {
    if (!o.replay_endpoint.empty()) {
      return absl::InvalidArgumentError("--kv-events-replay needs --kv-events");
    }
    if (!o.topic.empty()) return absl::InvalidArgumentError("--kv-events-topic needs --kv-events");
    return absl::OkStatus();
  }
  if (!HasTransport(o.endpoint)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-events: '", o.endpoint,
        "' is not a ZMQ endpoint (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH)"));
  }
  if (!o.replay_endpoint.empty() && !HasTransport(o.replay_endpoint)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-events-replay: '", o.replay_endpoint,
        "' is not a ZMQ endpoint (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH)"));
  }
  // The same endpoint twice cannot bind twice ("*" ports are chosen apart by the OS).
  if (!o.replay_endpoint.empty() && o.replay_endpoint == o.endpoint &&
      !absl::EndsWith(o.endpoint, ":*") && !absl::EndsWith(o.endpoint, ":0")) {
    return absl::InvalidArgumentError(
        "--kv-events-replay must differ from --kv-events (two sockets, two endpoints)");
  }
  if (o.buffer_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-events-buffer must be at least 1, got ", o.buffer_batches));
  }
  if (o.queue_batches < 1) {
    return absl::InvalidArgumentError("KvEventsOptions.queue_batches must be at least 1");
  }
  return absl::OkStatus();
}

std::string EncodeKvEventBatch(double ts, const std::vector<KvEvent>& events,
                               int32_t data_parallel_rank, KvEventEncoding encoding) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  EventPacker ep(pk, encoding);
  for (const KvEvent& e : events) {
    if (const auto* s = std::get_if<KvBlockStored>(&e)) {
      PackStored(ep, *s);
    } else if (const auto* r = std::get_if<KvBlockRemoved>(&e)) {
      ep.Begin("BlockRemoved", 2);
      ep.Field("block_hashes").pack_array(1).pack_uint64(r->block_hash);
      ep.Field("medium").pack(std::string(KvMediumName(r->medium)));
    } else {
      ep.Begin("AllBlocksCleared", 0);
    }
  }
  pk.pack_int32(data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

absl::StatusOr<std::shared_ptr<KvEventPublisher>> KvEventPublisher::Start(
    const KvEventsOptions& options) {
  if (absl::Status s = ValidateKvEventsOptions(options); !s.ok()) return s;
  PREFIXD_CHECK(!options.endpoint.empty());
  auto sockets = std::make_unique<Sockets>();
  try {
    // Lingering 1 s at close: batches sent just before shutdown still leave.
    sockets->pub.set(zmq::sockopt::linger, 1000);
    sockets->pub.bind(options.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-events ", options.endpoint, ": cannot bind: ", e.what()));
  }
  if (!options.replay_endpoint.empty()) {
    sockets->replay = zmq::socket_t(sockets->context, zmq::socket_type::router);
    try {
      sockets->replay.set(zmq::sockopt::linger, 0);
      sockets->replay.bind(options.replay_endpoint);
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-events-replay ", options.replay_endpoint, ": cannot bind: ", e.what()));
    }
  }
  return std::shared_ptr<KvEventPublisher>(new KvEventPublisher(options, std::move(sockets)));
}

KvEventPublisher::KvEventPublisher(const KvEventsOptions& options,
                                   std::unique_ptr<Sockets> sockets)
    : options_(options), sockets_(std::move(sockets)) {
  endpoint_ = sockets_->pub.get(zmq::sockopt::last_endpoint);
  if (sockets_->replay) replay_endpoint_ = sockets_->replay.get(zmq::sockopt::last_endpoint);
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(Queued{.seq = next_seq_++,
                            .ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()),
                            .events = {KvAllBlocksCleared{}}});
  }
  thread_ = std::thread([this] { Loop(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    paused_ = false;
  }
  thread_.join();
}

void KvEventPublisher::PauseForTest(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

void KvEventPublisher::Apply(const std::vector<KvEvent>& batch) {
  for (const KvEvent& e : batch) {
    if (const auto* s = std::get_if<KvBlockStored>(&e)) {
      resident_.insert_or_assign(std::pair{MediumKey(s->medium), s->block_hash},
                                 Resident{.stored = *s, .order = resident_order_++});
    } else if (const auto* r = std::get_if<KvBlockRemoved>(&e)) {
      resident_.erase(std::pair{MediumKey(r->medium), r->block_hash});
    } else {
      resident_.clear();
    }
  }
}

std::vector<KvEvent> KvEventPublisher::ResyncBatch() const {
  // A block's depth is taken from what is resident now, not when it was stored: a child may
  // become resident before its parent (the disk tier writes an evicted chain's leaf first),
  // and a parent may leave and come back. Every medium's copy of a hash has the same parent.
  absl::flat_hash_map<uint64_t, std::optional<uint64_t>> parent_of;
  for (const auto& [key, r] : resident_) {
    parent_of.emplace(r.stored.block_hash, r.stored.parent_block_hash);
  }
  absl::flat_hash_map<uint64_t, int64_t> depth_of;
  std::vector<uint64_t> chain;
  for (const auto& [hash, parent] : parent_of) {
    // Up to a resident root or a block whose depth is known, then down again. Bounded by the
    // number of blocks, should two hashes ever form a cycle.
    chain.clear();
    int64_t depth = -1;
    for (uint64_t h = hash; chain.size() <= parent_of.size();) {
      if (auto d = depth_of.find(h); d != depth_of.end()) {
        depth = d->second;
        break;
      }
      chain.push_back(h);
      const std::optional<uint64_t>& p = parent_of.at(h);
      if (!p.has_value() || !parent_of.contains(*p)) break;
      h = *p;
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) depth_of[*it] = ++depth;
  }
  std::vector<std::pair<int64_t, const Resident*>> all;
  all.reserve(resident_.size());
  for (const auto& [key, r] : resident_) all.emplace_back(depth_of.at(r.stored.block_hash), &r);
  // A parent is one level shallower than its child: by depth, parents come first.
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::pair{a.first, a.second->order} < std::pair{b.first, b.second->order};
  });
  std::vector<KvEvent> out;
  out.reserve(all.size() + 1);
  out.push_back(KvAllBlocksCleared{});
  for (const auto& [depth, r] : all) out.push_back(r->stored);
  return out;
}

void KvEventPublisher::Publish(std::vector<KvEvent> batch) {
  if (batch.empty()) return;
  const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  absl::MutexLock lock(&mu_);
  Apply(batch);
  const uint64_t seq = next_seq_++;
  if (static_cast<int64_t>(queue_.size()) >= options_.queue_batches) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    resync_ = true;
    return;
  }
  if (resync_) {
    batch = ResyncBatch();
    resync_ = false;
  }
  queue_.push_back(Queued{.seq = seq, .ts = ts, .events = std::move(batch)});
}

void KvEventPublisher::Loop() {
  Sockets& s = *sockets_;
  const zmq::const_buffer topic = zmq::buffer(options_.topic);
  while (true) {
    std::deque<Queued> work;
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (!paused_ && !queue_.empty());
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), kReplayPoll);
      if (!paused_) {
        work.swap(queue_);
        // A drop not yet followed by a queued batch (the engine went idle after it): the
        // queue has room now, so the resync leaves without waiting for the engine's next
        // change, after every batch numbered before it.
        if (resync_) {
          work.push_back(Queued{.seq = next_seq_++,
                                .ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()),
                                .events = ResyncBatch()});
          resync_ = false;
        }
      }
      stop = stop_;
    }
    for (Queued& q : work) {
      std::string payload = EncodeKvEventBatch(
          q.ts, q.events, 0,
          options_.encoding == "array" ? KvEventEncoding::kArray : KvEventEncoding::kMap);
      const std::string seq = BigEndian8(static_cast<int64_t>(q.seq));
      try {
        s.pub.send(topic, zmq::send_flags::sndmore);
        s.pub.send(zmq::buffer(seq), zmq::send_flags::sndmore);
        s.pub.send(zmq::buffer(payload), zmq::send_flags::none);
      } catch (const zmq::error_t&) {
        // A PUB socket drops for slow subscribers instead of failing; an error here means the
        // context is going away. The batch stays replayable.
      }
      published_.fetch_add(1, std::memory_order_relaxed);
      s.buffer.emplace_back(q.seq, std::move(payload));
      while (static_cast<int64_t>(s.buffer.size()) > options_.buffer_batches) {
        s.buffer.pop_front();
      }
    }
    if (stop) break;
    if (!s.replay) continue;
    // Every request waiting on the replay socket, without blocking.
    while (true) {
      std::vector<zmq::message_t> frames;
      zmq::recv_result_t got;
      try {
        got = zmq::recv_multipart(s.replay, std::back_inserter(frames), zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        break;
      }
      if (!got.has_value()) break;
      // [identity, start] from a DEALER, or [identity, "", start] from a REQ-style client.
      if (frames.size() < 2 || frames.back().size() != 8) continue;
      const bool delimited = frames.size() >= 3;
      const int64_t start = FromBigEndian8(frames.back());
      auto reply = [&](const std::string& seq, const std::string& payload) {
        s.replay.send(zmq::buffer(frames.front().data(), frames.front().size()),
                      zmq::send_flags::sndmore);
        if (delimited) s.replay.send(zmq::const_buffer(), zmq::send_flags::sndmore);
        s.replay.send(zmq::buffer(seq), zmq::send_flags::sndmore);
        s.replay.send(zmq::buffer(payload), zmq::send_flags::none);
      };
      try {
        for (const auto& [seq, payload] : s.buffer) {
          if (static_cast<int64_t>(seq) >= start) {
            reply(BigEndian8(static_cast<int64_t>(seq)), payload);
          }
        }
        reply(BigEndian8(-1), std::string());
      } catch (const zmq::error_t&) {
        // The client went away mid-answer (ROUTER drops to unknown peers): nothing to do.
      }
    }
  }
}

}  // namespace prefixd
