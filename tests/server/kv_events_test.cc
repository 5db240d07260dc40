// KV events (server/kv_events.h) read by a cppzmq SUB and DEALER client that decodes with
// msgpack-cxx: the payload shapes of vLLM's two encodings (tagged maps, arrays), sequence numbers
// consecutive from 0, replay byte for byte, a full queue's drop and the resync after it,
// flag checks, and the stream of a running server (stored blocks chain to their parents and
// carry the prompt's tokens). Evictions, tenants, adapters and the disk tier are checked by
// a second implementation, the router's view (kv_events_router_test.mjs).
//
// No timing is asserted: every wait is for a condition, with a generous bound.
#include "server/kv_events.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kWaitMs = 30000;  // generous: 2 busy cores

int64_t BigEndian(const zmq::message_t& m) {
  EXPECT_EQ(m.size(), 8u);
  uint64_t v = 0;
  const auto* p = static_cast<const unsigned char*>(m.data());
  for (size_t i = 0; i < 8 && i < m.size(); ++i) v = (v << 8) | p[i];
  return static_cast<int64_t>(v);
}

std::string BigEndian8(int64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(static_cast<uint64_t>(v) & 0xff);
    v = static_cast<int64_t>(static_cast<uint64_t>(v) >> 8);
  }
  return out;
}

// A decoded event, as a consumer sees it.
struct Decoded {
  std::string type;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::vector<uint32_t> tokens;
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;
  std::string medium;
  std::optional<std::string> lora_name;
  std::vector<std::vector<std::string>> extra_keys;
};

struct DecodedBatch {
  double ts = 0;
  std::vector<Decoded> events;
  int64_t dp_rank = -1;
  // How the events came: tagged maps (--kv-events-encoding map) or arrays (array).
  bool maps = false;
  bool arrays = false;
};

// A map-encoded event's fields, checked to be exactly `names` in that order (vLLM's
// declaration order, "type" first), as the array its positional twin would be.
std::vector<msgpack::object> FieldsInOrder(const msgpack::object& e,
                                           const std::vector<std::string>& names) {
  std::vector<msgpack::object> f;
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < e.via.map.size; ++i) {
    keys.push_back(e.via.map.ptr[i].key.as<std::string>());
    f.push_back(e.via.map.ptr[i].val);
  }
  EXPECT_EQ(keys, names);
  return f;
}

DecodedBatch Decode(const std::string& payload) {
  msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& o = h.get();
  DecodedBatch b;
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  EXPECT_EQ(o.via.array.size, 3u);
  if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) return b;
  EXPECT_EQ(o.via.array.ptr[0].type, msgpack::type::FLOAT64);
  b.ts = o.via.array.ptr[0].as<double>();
  b.dp_rank = o.via.array.ptr[2].as<int64_t>();
  for (const msgpack::object& e : o.via.array.ptr[1].as<std::vector<msgpack::object>>()) {
    std::vector<msgpack::object> f;
    if (e.type == msgpack::type::MAP) {
      b.maps = true;
      EXPECT_GE(e.via.map.size, 1u);
      if (e.via.map.size == 0) continue;
      EXPECT_EQ(e.via.map.ptr[0].key.as<std::string>(), "type");
      const std::string type = e.via.map.ptr[0].val.as<std::string>();
      if (type == "BlockStored") {
        f = FieldsInOrder(e, {"type", "block_hashes", "parent_block_hash", "token_ids",
                              "block_size", "lora_id", "medium", "lora_name", "extra_keys"});
      } else if (type == "BlockRemoved") {
        f = FieldsInOrder(e, {"type", "block_hashes", "medium"});
      } else {
        f = FieldsInOrder(e, {"type"});
      }
    } else {
      b.arrays = true;
      f = e.as<std::vector<msgpack::object>>();
    }
    Decoded d;
    d.type = f.at(0).as<std::string>();
    if (d.type == "BlockStored") {
      EXPECT_EQ(f.size(), 9u);
      d.hashes = f.at(1).as<std::vector<uint64_t>>();
      if (!f.at(2).is_nil()) d.parent = f.at(2).as<uint64_t>();
      d.tokens = f.at(3).as<std::vector<uint32_t>>();
      d.block_size = f.at(4).as<int64_t>();
      if (!f.at(5).is_nil()) d.lora_id = f.at(5).as<int64_t>();
      d.medium = f.at(6).as<std::string>();
      if (!f.at(7).is_nil()) d.lora_name = f.at(7).as<std::string>();
      d.extra_keys = f.at(8).as<std::vector<std::vector<std::string>>>();
    } else if (d.type == "BlockRemoved") {
      EXPECT_EQ(f.size(), 3u);
      d.hashes = f.at(1).as<std::vector<uint64_t>>();
      d.medium = f.at(2).as<std::string>();
    } else {
      EXPECT_EQ(d.type, "AllBlocksCleared");
      EXPECT_EQ(f.size(), 1u);
    }
    b.events.push_back(std::move(d));
  }
  return b;
}

struct Message {
  int64_t seq = 0;
  std::string payload;
};

// Asks the replay socket for every batch from `start`; returns them (the end marker checked).
std::vector<Message> Replay(zmq::context_t& ctx, const std::string& endpoint, int64_t start) {
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, kWaitMs);
  dealer.connect(endpoint);
  // vLLM's client is a DEALER sending an empty delimiter, then the start sequence number.
  const std::string start_bytes = BigEndian8(start);
  dealer.send(zmq::const_buffer(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start_bytes), zmq::send_flags::none);
  std::vector<Message> out;
  while (true) {
    std::vector<zmq::message_t> frames;
    auto got = zmq::recv_multipart(dealer, std::back_inserter(frames));
    EXPECT_TRUE(got.has_value()) << "no replay answer within " << kWaitMs << " ms";
    if (!got.has_value()) return out;
    EXPECT_EQ(frames.size(), 3u);
    if (frames.size() != 3) return out;
    EXPECT_EQ(frames[0].size(), 0u);  // the delimiter comes back
    const int64_t seq = BigEndian(frames[1]);
    if (seq == -1) {
      EXPECT_EQ(frames[2].size(), 0u);
      return out;
    }
    out.push_back(Message{seq, frames[2].to_string()});
  }
}

class Subscriber {
 public:
  Subscriber(zmq::context_t& ctx, const std::string& endpoint, const std::string& topic)
      : sub_(ctx, zmq::socket_type::sub), topic_(topic) {
    sub_.set(zmq::sockopt::linger, 0);
    sub_.set(zmq::sockopt::subscribe, topic);
    sub_.connect(endpoint);
  }
  // The next message within `ms`, or nullopt.
  std::optional<Message> Next(int ms) {
    sub_.set(zmq::sockopt::rcvtimeo, ms);
    std::vector<zmq::message_t> frames;
    auto got = zmq::recv_multipart(sub_, std::back_inserter(frames));
    if (!got.has_value()) return std::nullopt;
    EXPECT_EQ(frames.size(), 3u);
    if (frames.size() != 3) return std::nullopt;
    EXPECT_EQ(frames[0].to_string(), topic_);
    return Message{BigEndian(frames[1]), frames[2].to_string()};
  }

 private:
  zmq::socket_t sub_;
  std::string topic_;
};

KvBlockStored Stored(uint64_t hash, std::optional<uint64_t> parent, KvMedium medium) {
  return KvBlockStored{.block_hash = hash,
                       .parent_block_hash = parent,
                       .token_ids = {1, 2, 3, 4},
                       .block_size = 4,
                       .medium = medium,
                       .extra_keys = {"ns:00"}};
}

std::shared_ptr<KvEventPublisher> StartPublisher(KvEventsOptions o) {
  absl::StatusOr<std::shared_ptr<KvEventPublisher>> p = KvEventPublisher::Start(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : nullptr;
}

// The same four events, encoded both ways, read the same; the default writes tagged maps
// (vLLM's current wire), `array` the positional arrays of its earlier one.
class KvEventsEncodingTest : public ::testing::TestWithParam<KvEventEncoding> {};

TEST_P(KvEventsEncodingTest, PayloadIsVllmsBatch) {
  std::vector<KvEvent> events;
  events.push_back(KvAllBlocksCleared{});
  events.push_back(KvBlockStored{.block_hash = 0xfedcba9876543210ull,
                                 .parent_block_hash = std::nullopt,
                                 .token_ids = {7, 8, 9, 50256},
                                 .block_size = 4,
                                 .medium = KvMedium::kCpu,
                                 .extra_keys = {"ns:ab"}});
  events.push_back(KvBlockStored{.block_hash = 2,
                                 .parent_block_hash = 0xfedcba9876543210ull,
                                 .token_ids = {1, 2, 3, 4},
                                 .block_size = 4,
                                 .medium = KvMedium::kGpu,
                                 .lora_name = "sql",
                                 .lora_id = 12345,
                                 .extra_keys = {"ns:ab", "adapter:cd"}});
  events.push_back(KvBlockRemoved{.block_hash = 2, .medium = KvMedium::kDisk});
  const DecodedBatch b = Decode(EncodeKvEventBatch(1765000000.25, events, 0, GetParam()));
  EXPECT_EQ(b.maps, GetParam() == KvEventEncoding::kMap);
  EXPECT_EQ(b.arrays, GetParam() == KvEventEncoding::kArray);
  EXPECT_EQ(b.ts, 1765000000.25);
  EXPECT_EQ(b.dp_rank, 0);
  ASSERT_EQ(b.events.size(), 4u);
  EXPECT_EQ(b.events[0].type, "AllBlocksCleared");
  const Decoded& first = b.events[1];
  EXPECT_EQ(first.type, "BlockStored");
  EXPECT_THAT(first.hashes, ElementsAre(0xfedcba9876543210ull));
  EXPECT_FALSE(first.parent.has_value());
  EXPECT_THAT(first.tokens, ElementsAre(7, 8, 9, 50256));
  EXPECT_EQ(first.block_size, 4);
  EXPECT_FALSE(first.lora_id.has_value());
  EXPECT_EQ(first.medium, "CPU");
  EXPECT_FALSE(first.lora_name.has_value());
  EXPECT_THAT(first.extra_keys, ElementsAre(ElementsAre("ns:ab")));
  const Decoded& second = b.events[2];
  EXPECT_EQ(second.parent, 0xfedcba9876543210ull);
  EXPECT_EQ(second.medium, "GPU");
  EXPECT_EQ(second.lora_name, "sql");
  EXPECT_EQ(second.lora_id, 12345);
  EXPECT_THAT(second.extra_keys, ElementsAre(ElementsAre("ns:ab", "adapter:cd")));
  EXPECT_EQ(b.events[3].type, "BlockRemoved");
  EXPECT_THAT(b.events[3].hashes, ElementsAre(2u));
  EXPECT_EQ(b.events[3].medium, "DISK");
}

INSTANTIATE_TEST_SUITE_P(BothEncodings, KvEventsEncodingTest,
                         ::testing::Values(KvEventEncoding::kMap, KvEventEncoding::kArray),
                         [](const ::testing::TestParamInfo<KvEventEncoding>& info) {
                           return info.param == KvEventEncoding::kMap ? "Map" : "Array";
                         });

TEST(KvEventsEncodingDefaultTest, IsTaggedMaps) {
  EXPECT_EQ(KvEventsOptions().encoding, "map");
  const DecodedBatch b = Decode(EncodeKvEventBatch(1.5, {KvAllBlocksCleared{}}, 0));
  EXPECT_TRUE(b.maps);
  EXPECT_FALSE(b.arrays);
}

TEST(KvEventsOptionsTest, BadValuesNameTheirFlag) {
  auto message = [](KvEventsOptions o) {
    return std::string(ValidateKvEventsOptions(o).message());
  };
  EXPECT_TRUE(ValidateKvEventsOptions({}).ok());
  EXPECT_THAT(message({.endpoint = "127.0.0.1:5557"}), HasSubstr("--kv-events: '127.0.0.1:5557'"));
  EXPECT_THAT(message({.endpoint = "tcp://127.0.0.1:5557", .replay_endpoint = "5558"}),
              HasSubstr("--kv-events-replay: '5558'"));
  EXPECT_THAT(message({.replay_endpoint = "tcp://127.0.0.1:5558"}),
              HasSubstr("--kv-events-replay needs --kv-events"));
  EXPECT_THAT(message({.topic = "kv"}), HasSubstr("--kv-events-topic needs --kv-events"));
  EXPECT_THAT(message({.endpoint = "tcp://127.0.0.1:5557", .buffer_batches = 0}),
              HasSubstr("--kv-events-buffer must be at least 1, got 0"));
  EXPECT_THAT(message({.endpoint = "tcp://127.0.0.1:5557", .encoding = "msgpack"}),
              HasSubstr("--kv-events-encoding must be map"));
  EXPECT_THAT(message({.endpoint = "tcp://127.0.0.1:5557",
                       .replay_endpoint = "tcp://127.0.0.1:5557"}),
              HasSubstr("--kv-events-replay must differ from --kv-events"));
  // A bind that fails names the flag too.
  absl::StatusOr<std::shared_ptr<KvEventPublisher>> bad =
      KvEventPublisher::Start({.endpoint = "tcp://256.0.0.1:1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--kv-events tcp://256.0.0.1:1"));
}

TEST(KvEventPublisherTest, SequenceFromZeroLiveEqualsReplayByteForByte) {
  std::shared_ptr<KvEventPublisher> pub =
      StartPublisher({.endpoint = "tcp://127.0.0.1:*",
                      .replay_endpoint = "tcp://127.0.0.1:*",
                      .topic = "kv@replica-0"});
  ASSERT_NE(pub, nullptr);
  zmq::context_t ctx;
  Subscriber sub(ctx, pub->endpoint(), "kv@replica-0");
  // A SUB joins late (ZMQ's slow joiner): publish until one batch arrives, then every later
  // batch arrives in order.
  std::vector<Message> live;
  for (uint64_t h = 100; live.empty(); ++h) {
    ASSERT_LT(h, 100 + 3000u) << "the subscriber never received a batch";
    pub->Publish({Stored(h, std::nullopt, KvMedium::kCpu)});
    if (std::optional<Message> m = sub.Next(10)) live.push_back(*m);
  }
  pub->Publish({Stored(1, std::nullopt, KvMedium::kCpu), Stored(2, 1, KvMedium::kCpu)});
  pub->Publish({KvBlockRemoved{.block_hash = 2, .medium = KvMedium::kCpu}});
  // Batches published while waiting for the first one may still be in flight: read up to
  // the last one published.
  while (live.size() < 2 || Decode(live.back().payload).events[0].type != "BlockRemoved") {
    std::optional<Message> m = sub.Next(kWaitMs);
    ASSERT_TRUE(m.has_value()) << "a published batch did not arrive";
    live.push_back(*m);
  }
  for (size_t i = 1; i < live.size(); ++i) EXPECT_EQ(live[i].seq, live[i - 1].seq + 1);

  const std::vector<Message> replayed = Replay(ctx, pub->replay_endpoint(), 0);
  ASSERT_EQ(replayed.size(), static_cast<size_t>(live.back().seq + 1));
  for (size_t i = 0; i < replayed.size(); ++i) EXPECT_EQ(replayed[i].seq, static_cast<int64_t>(i));
  // Seq 0 is the start-up AllBlocksCleared.
  const DecodedBatch zero = Decode(replayed[0].payload);
  ASSERT_EQ(zero.events.size(), 1u);
  EXPECT_EQ(zero.events[0].type, "AllBlocksCleared");
  for (const Message& m : live) EXPECT_EQ(replayed[m.seq].payload, m.payload) << "seq " << m.seq;
  // Replay from the middle returns exactly the tail.
  const std::vector<Message> tail = Replay(ctx, pub->replay_endpoint(), live.back().seq - 1);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].payload, replayed[live.back().seq - 1].payload);
  EXPECT_EQ(tail[1].payload, live.back().payload);
  EXPECT_EQ(pub->dropped(), 0u);
}

TEST(KvEventPublisherTest, ReplayKeepsTheLastBufferBatches) {
  std::shared_ptr<KvEventPublisher> pub = StartPublisher({.endpoint = "tcp://127.0.0.1:*",
                                                          .replay_endpoint = "tcp://127.0.0.1:*",
                                                          .buffer_batches = 3});
  ASSERT_NE(pub, nullptr);
  for (uint64_t h = 1; h <= 5; ++h) pub->Publish({Stored(h, std::nullopt, KvMedium::kCpu)});
  zmq::context_t ctx;
  // Batches 0..5 were queued; once all six are sent the buffer holds 3, 4, 5.
  std::vector<Message> got;
  for (int tries = 0; tries < 3000; ++tries) {
    got = Replay(ctx, pub->replay_endpoint(), 0);
    if (pub->published() == 6 && !got.empty() && got.back().seq == 5) break;
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].seq, 3);
  EXPECT_EQ(got[2].seq, 5);
}

TEST(KvEventPublisherTest, AFullQueueDropsLeavesAGapAndResyncsParentsFirst) {
  std::shared_ptr<KvEventPublisher> pub = StartPublisher({.endpoint = "tcp://127.0.0.1:*",
                                                          .replay_endpoint = "tcp://127.0.0.1:*",
                                                          .queue_batches = 5});
  ASSERT_NE(pub, nullptr);
  pub->PauseForTest(true);
  // The start-up batch (seq 0) may or may not have left before the pause; fill the queue
  // until a batch is dropped.
  // The disk tier's blocks are resident like the pool's: files found at start-up (7, its
  // child 8), one of them later deleted for the cap (8).
  pub->Publish({Stored(7, std::nullopt, KvMedium::kDisk), Stored(8, 7, KvMedium::kDisk),
                Stored(1, std::nullopt, KvMedium::kCpu), Stored(2, 1, KvMedium::kCpu),
                Stored(3, 2, KvMedium::kCpu)});  // seq 1
  pub->Publish({KvBlockRemoved{.block_hash = 3, .medium = KvMedium::kCpu},
                KvBlockRemoved{.block_hash = 8, .medium = KvMedium::kDisk}});  // seq 2
  // Spill: the child reaches the disk before its parent (leaves are evicted first).
  pub->Publish({KvBlockRemoved{.block_hash = 2, .medium = KvMedium::kCpu},
                Stored(2, 1, KvMedium::kDisk)});                                    // seq 3
  pub->Publish({KvBlockRemoved{.block_hash = 1, .medium = KvMedium::kCpu},
                Stored(1, std::nullopt, KvMedium::kDisk)});  // seq 4
  int64_t next = 5;
  while (pub->dropped() == 0) {
    ASSERT_LT(next, 10);
    pub->Publish({Stored(50 + next, std::nullopt, KvMedium::kCpu)});
    ++next;
  }
  const int64_t dropped_seq = next - 1;
  // Once the queue has room again, the publisher thread queues the resync itself, after
  // every batch before the dropped one.
  pub->PauseForTest(false);
  zmq::context_t ctx;
  std::vector<Message> got;
  const int64_t resync_seq = next;
  for (int tries = 0; tries < 3000; ++tries) {
    got = Replay(ctx, pub->replay_endpoint(), 0);
    if (!got.empty() && got.back().seq == resync_seq) break;
  }
  ASSERT_FALSE(got.empty());
  ASSERT_EQ(got.back().seq, resync_seq);
  EXPECT_EQ(pub->dropped(), 1u);
  // Every sequence number but the dropped one, in order.
  std::vector<int64_t> seqs;
  for (const Message& m : got) seqs.push_back(m.seq);
  std::vector<int64_t> want;
  for (int64_t s = 0; s <= resync_seq; ++s) {
    if (s != dropped_seq) want.push_back(s);
  }
  EXPECT_EQ(seqs, want);
  // The resync: AllBlocksCleared, then what every batch (the dropped one too) left resident,
  // the disk tier's blocks included, parents first: disk 1 before disk 2, whatever order they
  // arrived in; disk 8 was deleted.
  const DecodedBatch resync = Decode(got.back().payload);
  std::vector<std::string> described;
  for (const Decoded& d : resync.events) {
    described.push_back(d.type == "BlockStored"
                            ? absl::StrCat(d.medium, ":", d.hashes.at(0))
                            : d.type);
  }
  // The roots (depth 0) keep the order they became resident in; then depth 1.
  std::vector<std::string> sorted_expected = {"AllBlocksCleared", "DISK:7", "DISK:1"};
  for (int64_t s = 5; s < resync_seq; ++s) sorted_expected.push_back(absl::StrCat("CPU:", 50 + s));
  sorted_expected.push_back("DISK:2");
  EXPECT_EQ(described, sorted_expected);
  EXPECT_EQ(pub->published(), got.size());
}

TEST(KvEventPublisherTest, AResyncAnnouncesAParentBeforeAChildThatWasStoredFirst) {
  std::shared_ptr<KvEventPublisher> pub = StartPublisher({.endpoint = "tcp://127.0.0.1:*",
                                                          .replay_endpoint = "tcp://127.0.0.1:*",
                                                          .queue_batches = 3});
  ASSERT_NE(pub, nullptr);
  pub->PauseForTest(true);
  // A chain 1 <- 2 in the pool; one step evicts both (the leaf first) for the disk tier,
  // whose writer then indexes the child's file before its parent's: when DISK 2 is stored,
  // its parent is resident nowhere yet.
  pub->Publish({Stored(1, std::nullopt, KvMedium::kCpu), Stored(2, 1, KvMedium::kCpu)});
  pub->Publish({KvBlockRemoved{.block_hash = 2, .medium = KvMedium::kCpu},
                KvBlockRemoved{.block_hash = 1, .medium = KvMedium::kCpu}});
  pub->Publish({Stored(2, 1, KvMedium::kDisk), Stored(1, std::nullopt, KvMedium::kDisk)});
  for (uint64_t h = 50; pub->dropped() == 0; ++h) {
    ASSERT_LT(h, 60u);
    pub->Publish({Stored(h, std::nullopt, KvMedium::kCpu)});
  }
  pub->PauseForTest(false);
  zmq::context_t ctx;
  // The drop is followed by a resync once the queue has room again.
  std::optional<DecodedBatch> resync;
  for (int tries = 0; tries < 3000 && !resync.has_value(); ++tries) {
    pub->Publish({Stored(100 + tries, std::nullopt, KvMedium::kCpu)});
    for (const Message& m : Replay(ctx, pub->replay_endpoint(), 1)) {
      DecodedBatch b = Decode(m.payload);
      if (!b.events.empty() && b.events[0].type == "AllBlocksCleared") resync = std::move(b);
    }
  }
  ASSERT_TRUE(resync.has_value()) << "no resync after the drop";
  // Replaying the resync, every parent is announced before its child.
  std::vector<std::string> disk;
  absl::flat_hash_set<uint64_t> announced;
  for (const Decoded& d : resync->events) {
    if (d.type != "BlockStored") continue;
    if (d.parent.has_value()) {
      EXPECT_TRUE(announced.contains(*d.parent))
          << d.medium << ":" << d.hashes.at(0) << " names parent " << *d.parent
          << " before it was announced";
    }
    announced.insert(d.hashes.at(0));
    if (d.medium == "DISK") disk.push_back(absl::StrCat(d.hashes.at(0)));
  }
  EXPECT_THAT(disk, ElementsAre("1", "2"));
}

TEST(KvEventPublisherTest, ADropIsFollowedByAResyncEvenIfNothingMoreIsPublished) {
  std::shared_ptr<KvEventPublisher> pub = StartPublisher({.endpoint = "tcp://127.0.0.1:*",
                                                          .replay_endpoint = "tcp://127.0.0.1:*",
                                                          .queue_batches = 2});
  ASSERT_NE(pub, nullptr);
  pub->PauseForTest(true);
  // The last batches of a burst are dropped, then the engine goes idle (no step changes the
  // index): the subscriber's view lacks the dropped batch until a resync comes.
  uint64_t last = 0;  // hashes 1..last published, the last one dropped
  while (pub->dropped() == 0) {
    ASSERT_LT(last, 10u);
    pub->Publish({Stored(++last, std::nullopt, KvMedium::kCpu)});
  }
  pub->PauseForTest(false);
  zmq::context_t ctx;
  std::optional<DecodedBatch> resync;
  for (int tries = 0; tries < 500 && !resync.has_value(); ++tries) {
    for (const Message& m : Replay(ctx, pub->replay_endpoint(), 1)) {
      DecodedBatch b = Decode(m.payload);
      if (!b.events.empty() && b.events[0].type == "AllBlocksCleared") resync = std::move(b);
    }
  }
  ASSERT_TRUE(resync.has_value()) << "no resync after the drop";
  std::vector<uint64_t> stored;
  for (const Decoded& d : resync->events) {
    if (d.type == "BlockStored") stored.push_back(d.hashes.at(0));
  }
  std::vector<uint64_t> want;
  for (uint64_t h = 1; h <= last; ++h) want.push_back(h);
  EXPECT_EQ(stored, want);
}

// ---- Through a running server ------------------------------------------------------------

class KvEventsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = dir_.path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
  }
  TempDir dir_;
  std::string model_dir_;
};

TEST_F(KvEventsServerTest, StoredBlocksChainAndCarryThePromptsTokens) {
  LogSink log;
  ServerOptions o = TestServerOptions(model_dir_, log.Writer());
  o.kv_events = {.endpoint = "tcp://127.0.0.1:*", .replay_endpoint = "tcp://127.0.0.1:*"};
  o.device.kv_pool.block_size = 16;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT(log.Text(), HasSubstr("kv events on " + (*server)->kv_events_endpoint() +
                                    ", replay on " + (*server)->kv_events_replay_endpoint()));
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->grpc_address()));
  const std::vector<uint32_t> prompt = RandomIds(11, 64);  // 4 full blocks
  GenerateResult r = Generate(*stub, IdsRequest(prompt, 1));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();

  zmq::context_t ctx;
  std::vector<Decoded> stored;
  for (int tries = 0; tries < 3000 && stored.size() < 4; ++tries) {
    stored.clear();
    for (const Message& m : Replay(ctx, (*server)->kv_events_replay_endpoint(), 0)) {
      for (Decoded& d : Decode(m.payload).events) {
        if (d.type == "BlockStored") stored.push_back(std::move(d));
      }
    }
  }
  ASSERT_GE(stored.size(), 4u);
  // The prompt's four blocks, in order, each the child of the one before.
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(stored[i].medium, "CPU");
    EXPECT_EQ(stored[i].block_size, 16);
    EXPECT_EQ(stored[i].tokens,
              std::vector<uint32_t>(prompt.begin() + 16 * i, prompt.begin() + 16 * (i + 1)));
    ASSERT_EQ(stored[i].hashes.size(), 1u);
    if (i == 0) {
      EXPECT_FALSE(stored[i].parent.has_value());
    } else {
      EXPECT_EQ(stored[i].parent, stored[i - 1].hashes[0]);
    }
    EXPECT_FALSE(stored[i].lora_name.has_value());
    ASSERT_EQ(stored[i].extra_keys.size(), 1u);
    ASSERT_EQ(stored[i].extra_keys[0].size(), 1u);
    EXPECT_THAT(stored[i].extra_keys[0][0], ::testing::StartsWith("ns:"));
  }
}

}  // namespace
}  // namespace prefixd::testing
