// RemoteTierOptions: how a remote cache tier (cache/remote/remote_tier.h) is reached. Apart
// from the tier so that whoever only configures one (EngineOptions) compiles none of its
// threads, locks or hiredis.
#ifndef PREFIXD_CACHE_REMOTE_REMOTE_TIER_OPTIONS_H_
#define PREFIXD_CACHE_REMOTE_REMOTE_TIER_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"

namespace prefixd {

// No engine thread waits on a command (each runs on a tier thread), so the timeout bounds
// only how long the requests that wait for one answer wait. 250 ms by default: a local Redis
// answers in well under a millisecond, but a host busy enough to delay Redis's turn on a CPU
// by 20 ms (a replica's 2 vCPUs shared with Redis, docs/BENCHMARKS.md) made a 20 ms timeout
// fire hundreds of times a run, and each one backs the tier off and computes prefixes it
// holds.
inline constexpr absl::Duration kDefaultRemoteTierTimeout = absl::Milliseconds(250);
inline constexpr absl::Duration kMaxRemoteTierTimeout = absl::Seconds(10);

// url, key_prefix and timeout are prefixd flags (--kv-remote, --kv-remote-prefix,
// --kv-remote-timeout); RemoteTier::Open checks them, naming the flag.
struct RemoteTierOptions {
  // redis://HOST:PORT[/DB] or unix:///path/to/redis.sock (a Redis or Valkey server); empty:
  // no remote tier. A password never goes in the URL (it would show in `ps`): see `password`.
  std::string url;
  // Sent with AUTH after every connect when not empty (read from --kv-remote-password-file).
  std::string password;
  // Every key this tier reads or writes starts with it, so that one Redis can hold other
  // data, or several fleets (each its own prefix).
  std::string key_prefix = "prefixd:";
  // Bound on one connect and on one command (a pipelined match, a GET, a SET), on the tier's
  // threads. A request waiting for an answer waits at most this long for a tier that has
  // stopped answering (then computes); the tier is skipped until the backoff below has passed.
  absl::Duration timeout = kDefaultRemoteTierTimeout;
  // Bound on the whole of one request's fetch, from the engine asking (RemoteTier::Fetch) to
  // its last block: the wait behind the fetches queued before it, a reconnect and the round
  // trip together. What has not arrived and verified by then is computed; the blocks before
  // it are kept. A fetch cut short is a fault like a timed-out command (counted, the
  // connection closed, the backoff started). Zero (the default): twice `timeout` (see
  // FetchTimeout): one for the server's answer, one for its bytes, since a full fetch budget
  // (64 GPT-2 blocks, 75 MB) takes ~170 ms to read and verify even from a healthy Redis, and
  // four requests' fetches from a Redis 200 ms late read nothing in time with 250 ms in all
  // (docs/BENCHMARKS.md, "Remote cache tier"). A request so waits at most one timeout for
  // the match and two for its blocks, however many; computing 16 GPT-2 blocks costs more.
  absl::Duration fetch_timeout = absl::ZeroDuration();
  // Bound on the whole of one match (the existence check before a fetch), from the engine
  // asking (RemoteTier::StartMatch) to its answer: the wait behind the round trip before it
  // and its own round trip together. A match not answered by then is a miss (counted in
  // match_timeouts; its blocks are computed), and one cut short on the wire is a fault like a
  // timed-out command. Zero (the default): twice `timeout` (see MatchTimeout), as for a
  // fetch: one for the round trip it may wait behind (the matches queued meanwhile go in
  // the next one), one for its own. With one timeout, three of four requests arriving
  // together at a Redis 200 ms late missed: their round trip could not end in time.
  absl::Duration match_timeout = absl::ZeroDuration();
  // Whether the engine waits for a fetch at most as long as computing its blocks would take
  // (KvTier::wait_capped_at_compute, engine/kv_offloader.h); tests that hold a fetch on
  // purpose turn it off.
  bool cap_wait_at_compute = true;
  // After a failure, the tier is not asked again for backoff_min, doubling per failure up to
  // backoff_max; one success resets it.
  absl::Duration backoff_min = absl::Milliseconds(100);
  absl::Duration backoff_max = absl::Seconds(5);
  // Blocks waiting to be published; more are dropped (counted). 64 blocks of full-size
  // GPT-2 fp32 are ~75 MB.
  int32_t max_queued_blocks = 64;
  // A match asks about at most this many blocks past the local tiers (one pipelined round
  // trip).
  int32_t max_match_blocks = 256;
  // Blocks being fetched (or fetched and not yet taken by their request) at once, over all
  // requests: their K/V wait in memory (64 blocks of full-size GPT-2 fp32 are ~75 MB).
  int32_t max_fetch_blocks = 64;
  // Runs on the fetcher thread before each block's commands are queued (all of a fetch's go
  // out together, after the last one); unset in production. The one seam to a slow network,
  // as DiskTierOptions::write_file is to a slow disk.
  std::function<void()> fetch_hook;
  // Receives one line per fault (what failed and why); the caller rate-limits it. Unset: not
  // logged (the fault is still counted).
  std::function<void(const std::string&)> log;
};

// The bound on a whole fetch that `options` give (fetch_timeout, or twice the timeout).
inline absl::Duration FetchTimeout(const RemoteTierOptions& options) {
  return options.fetch_timeout > absl::ZeroDuration() ? options.fetch_timeout : 2 * options.timeout;
}

// The bound on a whole match that `options` give (match_timeout, or twice the timeout).
inline absl::Duration MatchTimeout(const RemoteTierOptions& options) {
  return options.match_timeout > absl::ZeroDuration() ? options.match_timeout
                                                      : 2 * options.timeout;
}

}  // namespace prefixd

#endif  // PREFIXD_CACHE_REMOTE_REMOTE_TIER_OPTIONS_H_
