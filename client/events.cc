#include "client/events.h"

#include <iterator>
#include <ostream>
#include <utility>

#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace prefixd {
namespace {

std::string Hash(const msgpack::object& o) {
  if (o.is_nil()) return "-";
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    return absl::StrFormat("%016x", o.as<uint64_t>());
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return absl::StrCat(o.as<int64_t>());
  if (o.type == msgpack::type::BIN || o.type == msgpack::type::STR) {
    std::string out;
    for (char c : o.as<std::string>()) absl::StrAppendFormat(&out, "%02x", static_cast<uint8_t>(c));
    return out;
  }
  return "?";
}

std::string Hashes(const msgpack::object& o) {
  std::vector<std::string> out;
  for (const msgpack::object& h : o.as<std::vector<msgpack::object>>()) out.push_back(Hash(h));
  return absl::StrJoin(out, ",");
}

std::string Event(const std::vector<msgpack::object>& f) {
  const std::string type = f.at(0).as<std::string>();
  if (type == "BlockStored") {
    const auto tokens = f.at(3).as<std::vector<uint64_t>>();
    std::string extra;
    if (f.size() > 8 && !f.at(8).is_nil()) {
      std::vector<std::string> keys;
      for (const msgpack::object& per_block : f.at(8).as<std::vector<msgpack::object>>()) {
        if (per_block.is_nil()) continue;
        for (const msgpack::object& k : per_block.as<std::vector<msgpack::object>>()) {
          keys.push_back(k.type == msgpack::type::STR ? k.as<std::string>() : "?");
        }
      }
      extra = absl::StrJoin(keys, ",");
    }
    return absl::StrCat(
        "BlockStored hash ", Hashes(f.at(1)), " parent ", Hash(f.at(2)), " medium ",
        f.size() > 6 && !f.at(6).is_nil() ? f.at(6).as<std::string>() : "-", " tokens ",
        tokens.size(),
        tokens.empty() ? std::string()
                       : absl::StrCat(" [", tokens.front(), "..", tokens.back(), "]"),
        " lora ", f.size() > 7 && !f.at(7).is_nil() ? f.at(7).as<std::string>() : "-",
        " extra ", extra.empty() ? "-" : extra);
  }
  if (type == "BlockRemoved") {
    return absl::StrCat("BlockRemoved hash ", Hashes(f.at(1)), " medium ",
                        f.size() > 2 && !f.at(2).is_nil() ? f.at(2).as<std::string>() : "-");
  }
  return type;  // AllBlocksCleared, or an event this prefixctl does not know
}

// An event's fields by position, the type first, from either encoding: an array as it is,
// a tagged map (vLLM's current wire) by the field names in vLLM's declaration order; a field
// the map lacks is nil, and one this prefixctl does not know (a later vLLM's) is skipped.
std::vector<msgpack::object> Positional(const msgpack::object& e) {
  if (e.type != msgpack::type::MAP) return e.as<std::vector<msgpack::object>>();
  auto find = [&](std::string_view name) {
    for (uint32_t i = 0; i < e.via.map.size; ++i) {
      const msgpack::object& k = e.via.map.ptr[i].key;
      if (k.type == msgpack::type::STR &&
          std::string_view(k.via.str.ptr, k.via.str.size) == name) {
        return e.via.map.ptr[i].val;
      }
    }
    return msgpack::object();  // nil
  };
  const msgpack::object type = find("type");
  std::vector<std::string_view> names;
  if (type.type == msgpack::type::STR) {
    const std::string_view t(type.via.str.ptr, type.via.str.size);
    if (t == "BlockStored") {
      names = {"block_hashes", "parent_block_hash", "token_ids", "block_size",
               "lora_id",      "medium",            "lora_name", "extra_keys"};
    } else if (t == "BlockRemoved") {
      names = {"block_hashes", "medium"};
    }
  }
  std::vector<msgpack::object> f = {type};
  for (std::string_view name : names) f.push_back(find(name));
  return f;
}

int64_t FromBigEndian8(const zmq::message_t& m) {
  uint64_t v = 0;
  const auto* p = static_cast<const unsigned char*>(m.data());
  for (size_t i = 0; i < m.size() && i < 8; ++i) v = (v << 8) | p[i];
  return static_cast<int64_t>(v);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> FormatKvEventBatch(int64_t seq,
                                                            std::string_view payload) {
  try {
    msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
    const auto batch = h.get().as<std::vector<msgpack::object>>();
    if (batch.size() < 2) return absl::InvalidArgumentError("a batch has ts and events");
    const std::string prefix = absl::StrFormat("seq %d ts %.6f ", seq, batch[0].as<double>());
    std::vector<std::string> lines;
    for (const msgpack::object& e : batch[1].as<std::vector<msgpack::object>>()) {
      lines.push_back(prefix + Event(Positional(e)));
    }
    return lines;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq ", seq, ": not a KV event batch (", e.what(), ")"));
  }
}

int RunEvents(const EventsArgs& args, std::ostream& out, std::ostream& err) {
  uint64_t printed = 0;
  std::optional<int64_t> next;
  // Prints one batch; false once --count events were printed.
  auto print = [&](int64_t seq, std::string_view payload) {
    if (next.has_value() && seq > *next) {
      out << "gap: seq " << *next << ".." << seq - 1 << " missing\n";
    }
    next = seq + 1;
    absl::StatusOr<std::vector<std::string>> lines = FormatKvEventBatch(seq, payload);
    if (!lines.ok()) {
      err << "prefixctl: " << lines.status().message() << "\n";
      return true;
    }
    for (const std::string& l : *lines) {
      out << l << "\n";
      if (args.count.has_value() && ++printed >= *args.count) {
        out.flush();
        return false;
      }
    }
    out.flush();
    return true;
  };
  try {
    zmq::context_t ctx;
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::subscribe, args.topic);
    sub.connect(args.endpoint);
    if (!args.replay_endpoint.empty()) {
      zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
      dealer.set(zmq::sockopt::linger, 0);
      dealer.connect(args.replay_endpoint);
      std::string start(8, '\0');
      for (int i = 0; i < 8; ++i) {
        start[7 - i] = static_cast<char>((static_cast<uint64_t>(args.from) >> (8 * i)) & 0xff);
      }
      dealer.send(zmq::const_buffer(), zmq::send_flags::sndmore);
      dealer.send(zmq::buffer(start), zmq::send_flags::none);
      while (true) {
        std::vector<zmq::message_t> frames;
        if (!zmq::recv_multipart(dealer, std::back_inserter(frames)).has_value()) break;
        if (frames.size() != 3 || frames[1].size() != 8) {
          err << "prefixctl: the replay socket answered " << frames.size() << " frames\n";
          return 1;
        }
        const int64_t seq = FromBigEndian8(frames[1]);
        if (seq == -1) break;
        if (!print(seq, frames[2].to_string_view())) return 0;
      }
    }
    while (true) {
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(sub, std::back_inserter(frames)).has_value()) continue;
      if (frames.size() != 3 || frames[1].size() != 8) {
        err << "prefixctl: a message of " << frames.size() << " frames, not [topic, seq, payload]\n";
        continue;
      }
      const int64_t seq = FromBigEndian8(frames[1]);
      if (next.has_value() && seq < *next) continue;  // already printed from the replay
      if (!print(seq, frames[2].to_string_view())) return 0;
    }
  } catch (const zmq::error_t& e) {
    err << "prefixctl: " << args.endpoint << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace prefixd
