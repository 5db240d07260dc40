// prefixctl events: a replica's KV event stream (--kv-events, docs/SERVER.md "KV events"),
// decoded, one line per event, for an operator watching what a replica holds. The wire is
// vLLM's (PUB [topic, seq, payload], msgpack batches of tagged-map or array-like events, as
// current and earlier vLLM write them; both are read); prefixctl reads it with its
// own decoder, so it is also a check of the stream against a second reader.
#ifndef PREFIXD_CLIENT_EVENTS_H_
#define PREFIXD_CLIENT_EVENTS_H_

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace prefixd {

struct EventsArgs {
  std::string endpoint;         // --kv-events: the replica's PUB endpoint (required)
  std::string topic;            // --topic: the replica's --kv-events-topic
  std::string replay_endpoint;  // --replay: first ask this ROUTER for the buffered batches
  int64_t from = 0;             // --from: the first sequence number asked of --replay
  std::optional<uint64_t> count;  // --count: exit after this many events (else run until killed)
};

// The lines of one batch: "seq N ts T AllBlocksCleared", "seq N ts T BlockStored hash H
// parent P|- medium M tokens K [first..last] lora NAME|- extra K1,K2", "seq N ts T
// BlockRemoved hash H medium M". INVALID_ARGUMENT for a payload that is not a batch.
absl::StatusOr<std::vector<std::string>> FormatKvEventBatch(int64_t seq,
                                                            std::string_view payload);

// Subscribes and prints until --count events were printed (0) or the stream fails (1). A gap
// in the sequence numbers is printed as "gap: seq A..B missing".
int RunEvents(const EventsArgs& args, std::ostream& out, std::ostream& err);

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_EVENTS_H_
