// prefixctl events: its decoder (client/events.h) on batches encoded here with msgpack-cxx
// in vLLM's two layouts (array-like, and the tagged maps it writes now), and its command
// line.
#include "client/events.h"

#include <string>
#include <vector>

#include <msgpack.hpp>

#include "client/cli_args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Batch() {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(3);
  pk.pack_double(12.5);
  pk.pack_array(3);
  pk.pack_array(1);
  pk.pack(std::string("AllBlocksCleared"));
  pk.pack_array(9);
  pk.pack(std::string("BlockStored"));
  pk.pack_array(1);
  pk.pack_uint64(0xfedcba9876543210ull);
  pk.pack_uint64(0x10);
  pk.pack(std::vector<uint32_t>{5, 6, 7, 8});
  pk.pack_int32(4);
  pk.pack_int64(99);
  pk.pack(std::string("CPU"));
  pk.pack(std::string("sql"));
  pk.pack_array(1);
  pk.pack(std::vector<std::string>{"ns:ab", "adapter:cd"});
  pk.pack_array(3);
  pk.pack(std::string("BlockRemoved"));
  pk.pack_array(1);
  pk.pack_uint64(7);
  pk.pack(std::string("DISK"));
  pk.pack_int32(0);
  return std::string(buf.data(), buf.size());
}

TEST(EventsFormatTest, OneLinePerEvent) {
  absl::StatusOr<std::vector<std::string>> lines = FormatKvEventBatch(3, Batch());
  ASSERT_TRUE(lines.ok()) << lines.status();
  EXPECT_THAT(*lines,
              ElementsAre("seq 3 ts 12.500000 AllBlocksCleared",
                          "seq 3 ts 12.500000 BlockStored hash fedcba9876543210 parent "
                          "0000000000000010 medium CPU tokens 4 [5..8] lora sql extra "
                          "ns:ab,adapter:cd",
                          "seq 3 ts 12.500000 BlockRemoved hash 0000000000000007 medium DISK"));
}

// The same batch as vLLM writes it now: each event a map tagged by "type", here with its
// keys in another order and a field this prefixctl does not know (vLLM's group_idx), which
// it skips.
std::string MapBatch() {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  auto key = [&](const char* k) { pk.pack(std::string(k)); };
  pk.pack_array(3);
  pk.pack_double(12.5);
  pk.pack_array(3);
  pk.pack_map(1);
  key("type");
  key("AllBlocksCleared");
  pk.pack_map(10);
  key("type");
  key("BlockStored");
  key("parent_block_hash");
  pk.pack_uint64(0x10);
  key("block_hashes");
  pk.pack_array(1);
  pk.pack_uint64(0xfedcba9876543210ull);
  key("token_ids");
  pk.pack(std::vector<uint32_t>{5, 6, 7, 8});
  key("block_size");
  pk.pack_int32(4);
  key("lora_id");
  pk.pack_int64(99);
  key("group_idx");
  pk.pack_int32(0);
  key("medium");
  key("CPU");
  key("lora_name");
  key("sql");
  key("extra_keys");
  pk.pack_array(1);
  pk.pack(std::vector<std::string>{"ns:ab", "adapter:cd"});
  pk.pack_map(3);
  key("type");
  key("BlockRemoved");
  key("block_hashes");
  pk.pack_array(1);
  pk.pack_uint64(7);
  key("medium");
  key("DISK");
  pk.pack_int32(0);
  return std::string(buf.data(), buf.size());
}

TEST(EventsFormatTest, TaggedMapsReadAsArrays) {
  absl::StatusOr<std::vector<std::string>> maps = FormatKvEventBatch(3, MapBatch());
  ASSERT_TRUE(maps.ok()) << maps.status();
  absl::StatusOr<std::vector<std::string>> arrays = FormatKvEventBatch(3, Batch());
  ASSERT_TRUE(arrays.ok()) << arrays.status();
  EXPECT_EQ(*maps, *arrays);
}

TEST(EventsFormatTest, NotABatchIsAnError) {
  absl::StatusOr<std::vector<std::string>> lines = FormatKvEventBatch(4, "\xc1garbage");
  ASSERT_FALSE(lines.ok());
  EXPECT_THAT(std::string(lines.status().message()), HasSubstr("seq 4: not a KV event batch"));
}

TEST(EventsFormatTest, CommandLine) {
  absl::StatusOr<CliArgs> a = ParseCliArgs({"events", "--kv-events", "tcp://127.0.0.1:5557",
                                            "--topic", "kv", "--replay", "tcp://127.0.0.1:5558",
                                            "--from", "12", "--count", "3"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->command, Command::kEvents);
  EXPECT_EQ(a->events.endpoint, "tcp://127.0.0.1:5557");
  EXPECT_EQ(a->events.topic, "kv");
  EXPECT_EQ(a->events.replay_endpoint, "tcp://127.0.0.1:5558");
  EXPECT_EQ(a->events.from, 12);
  EXPECT_EQ(a->events.count, 3u);
  auto error = [](std::vector<std::string> args) {
    absl::StatusOr<CliArgs> r = ParseCliArgs(args);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_THAT(error({"events"}), HasSubstr("events needs --kv-events ENDPOINT"));
  EXPECT_THAT(error({"events", "--kv-events", "tcp://h:1", "--from", "3"}),
              HasSubstr("--from needs --replay ENDPOINT"));
  EXPECT_THAT(error({"events", "--kv-events", "tcp://h:1", "--count", "0"}),
              HasSubstr("--count must be >= 1"));
  EXPECT_THAT(error({"events", "--kv-events", "tcp://h:1", "extra"}),
              HasSubstr("unexpected argument \"extra\""));
}

}  // namespace
}  // namespace prefixd
