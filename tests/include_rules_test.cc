// The include rules of docs/ARCHITECTURE.md ("Rooms and include rules"), checked on the source
// tree: every `#include "..."` of a room's headers and sources names a room that room may
// include, and where the table allows only some headers of a room, only those. A new include
// that points upward (cache/ reaching engine/, a backend reaching the other, engine/ reaching
// kernels/ or server/) fails here with the file, the line and the rule.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;

// The rooms, most specific first (a path belongs to the first room it starts with).
const std::vector<std::string> kRooms = {"kernels/cuda/interpret/",
                                         "kernels/cuda/",
                                         "kernels/cpu/",
                                         "cache/disk/",
                                         "cache/remote/",
                                         "engine/internal/",
                                         "cache/",
                                         "engine/",
                                         "base/",
                                         "tools/",
                                         "server/",
                                         "client/",
                                         "prefixd/" /* generated from proto/ */};

std::string RoomOf(const std::string& path) {
  for (const std::string& room : kRooms) {
    if (path.rfind(room, 0) == 0) return room;
  }
  return "";  // not the project's (a library's header)
}

struct Rule {
  std::set<std::string> rooms;  // rooms it may include (itself always)
  // Rooms of which it may include only these headers (paths from the repository root).
  std::map<std::string, std::set<std::string>> only;
};

const std::map<std::string, Rule>& Rules() {
  static const auto* rules = new std::map<std::string, Rule>{
      {"base/", {{}, {}}},
      {"cache/", {{"base/"}, {}}},
      {"cache/disk/", {{"cache/", "base/"}, {}}},
      {"cache/remote/", {{"cache/", "base/"}, {}}},
      {"engine/", {{"cache/", "cache/disk/", "cache/remote/", "engine/internal/", "base/"}, {}}},
      {"engine/internal/", {{"base/"}, {}}},
      {"kernels/cpu/",
       {{"engine/", "cache/", "base/"},
        {{"engine/",
          {"engine/backend.h", "engine/dtype.h", "engine/model.h", "engine/lora_adapter.h"}},
         {"cache/", {"cache/kv_layout.h", "cache/kv_pool.h"}}}}},
      {"kernels/cuda/",
       {{"engine/", "cache/", "base/"}, {{"cache/", {"cache/kv_layout.h", "cache/kv_pool.h"}}}}},
      {"kernels/cuda/interpret/", {{"base/"}, {}}},
      {"tools/", {{"engine/", "cache/", "kernels/cpu/", "base/"}, {}}},
      {"server/",
       {{"engine/", "cache/", "cache/remote/", "kernels/cpu/", "kernels/cuda/", "prefixd/",
         "base/"},
        {{"cache/", {"cache/block_key.h", "cache/kv_layout.h", "cache/kv_pool.h"}},
         {"cache/remote/", {"cache/remote/remote_tier_options.h"}}}}},
      {"client/", {{"prefixd/", "base/"}, {}}},
  };
  return *rules;
}

// Files allowed to include the backends: construction happens in one place.
const std::set<std::string> kBackendIncluders = {"server/backend_factory.cc"};

TEST(IncludeRulesTest, NoIncludePointsUpward) {
  const fs::path root(PREFIXD_SOURCE_DIR);
  static const std::regex kInclude(R"re(^\s*#\s*include\s+"([^"]+)")re");
  int checked = 0;
  std::vector<std::string> violations;
  for (const auto& [room, rule] : Rules()) {
    const fs::path dir = root / room;
    ASSERT_TRUE(fs::is_directory(dir)) << room;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh")) {
        continue;
      }
      const std::string file = room + e.path().filename().string();
      std::ifstream in(e.path());
      std::string line;
      std::smatch m;
      for (int n = 1; std::getline(in, line); ++n) {
        if (!std::regex_search(line, m, kInclude)) continue;
        const std::string target = m[1];
        const std::string to = RoomOf(target);
        if (to.empty() || to == room) continue;
        ++checked;
        auto fail = [&](const std::string& why) {
          violations.push_back(file + ":" + std::to_string(n) + ": \"" + target + "\": " + why);
        };
        if (!rule.rooms.count(to)) {
          fail(room + " may not include " + to);
          continue;
        }
        if (auto only = rule.only.find(to);
            only != rule.only.end() && !only->second.count(target)) {
          fail(room + " may include only some headers of " + to);
        }
        if ((to == "kernels/cpu/" || to == "kernels/cuda/") && room == "server/" &&
            !kBackendIncluders.count(file)) {
          fail("only server/backend_factory.cc constructs backends");
        }
      }
    }
  }
  EXPECT_GT(checked, 100) << "the scan found too few includes to mean anything";
  for (const std::string& v : violations) ADD_FAILURE() << v;
}

// The project headers `file` includes, directly or through others (a path from the root).
std::set<std::string> TransitiveIncludes(const std::string& file) {
  const fs::path root(PREFIXD_SOURCE_DIR);
  static const std::regex kInclude(R"re(^\s*#\s*include\s+"([^"]+)")re");
  std::set<std::string> seen;
  std::vector<std::string> todo = {file};
  while (!todo.empty()) {
    const std::string f = todo.back();
    todo.pop_back();
    std::ifstream in(root / f);
    std::string line;
    std::smatch m;
    while (std::getline(in, line)) {
      if (!std::regex_search(line, m, kInclude)) continue;
      const std::string target = m[1];
      if (RoomOf(target).empty() || !seen.insert(target).second) continue;
      todo.push_back(target);
    }
  }
  return seen;
}

// The front ends' headers include only what they need: the request path's and the OpenAI
// wire format's forward-declare the engine, its stats, streams and tokenizer, so no tier's
// header (nor the disk record format) reaches the front ends through them.
TEST(IncludeRulesTest, FrontEndHeadersReachNoTierHeader) {
  for (const std::string header :
       {"server/request_path.h", "server/openai_api.h", "server/http_completion.h"}) {
    const std::set<std::string> reached = TransitiveIncludes(header);
    EXPECT_TRUE(reached.count("engine/request.h")) << header << ": the scan found nothing";
    for (const std::string& h : reached) {
      const std::string room = RoomOf(h);
      if (room == "cache/" || room == "cache/disk/" || room == "cache/remote/") {
        EXPECT_EQ(h, "cache/kv_pool.h") << header << " reaches " << h;
      }
      EXPECT_NE(h, "engine/engine.h") << header;
      EXPECT_NE(h, "engine/engine_options.h") << header;
    }
  }
}

// The tiers and their record format are the engine's inside (docs/ARCHITECTURE.md): no header
// the front ends include reaches them, and a sequence's state only forward-declares the
// offloader's.
TEST(IncludeRulesTest, TierStateStaysInsideTheEngine) {
  const std::set<std::string> kTierHeaders = {
      "cache/block_record.h",       "cache/tier.h",          "cache/disk/disk_tier.h",
      "cache/remote/remote_tier.h", "engine/kv_offloader.h", "engine/kv_tiers.h"};
  const fs::path root(PREFIXD_SOURCE_DIR);
  int checked = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(root / "server")) {
    if (e.path().extension() != ".h") continue;
    const std::string header = "server/" + e.path().filename().string();
    ++checked;
    for (const std::string& reached : TransitiveIncludes(header)) {
      EXPECT_FALSE(kTierHeaders.count(reached)) << header << " reaches " << reached;
    }
  }
  EXPECT_GT(checked, 10) << "the scan found too few server headers to mean anything";
  for (const char* header : {"engine/engine.h", "engine/sequence.h", "engine/engine_options.h"}) {
    const std::set<std::string> reached = TransitiveIncludes(header);
    EXPECT_FALSE(reached.empty()) << "the scan found nothing under " << header;
    for (const std::string& r : reached) {
      EXPECT_FALSE(kTierHeaders.count(r)) << header << " reaches " << r;
    }
  }
}

// The table's shape: paths match their most specific room, and the upward arrows are absent.
TEST(IncludeRulesTest, RoomsAreMatchedMostSpecificFirst) {
  EXPECT_EQ(RoomOf("kernels/cuda/interpret/half.h"), "kernels/cuda/interpret/");
  EXPECT_EQ(RoomOf("cache/disk/disk_tier.h"), "cache/disk/");
  EXPECT_EQ(RoomOf("cache/kv_pool.h"), "cache/");
  EXPECT_EQ(RoomOf("absl/status/status.h"), "");
  EXPECT_FALSE(Rules().at("cache/").rooms.count("engine/"));
  EXPECT_FALSE(Rules().at("engine/").rooms.count("kernels/cpu/"));
  EXPECT_FALSE(Rules().at("kernels/cpu/").rooms.count("kernels/cuda/"));
  EXPECT_FALSE(Rules().at("client/").rooms.count("server/"));
}

}  // namespace
}  // namespace prefixd
