#include "cache/disk/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/file.h"
#include "cache/block_key.h"

namespace prefixd {
namespace {

constexpr char kLockName[] = "LOCK";
constexpr char kBlockSuffix[] = ".kvb";
constexpr char kTempSuffix[] = ".tmp";

std::string ErrnoText(int err) { return std::strerror(err); }

// Parses "<64 hex>" into a digest.
std::optional<Digest> ParseHexDigest(std::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  Digest d;
  for (size_t i = 0; i < d.size(); ++i) {
    int v = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = hex[2 * i + k];
      int n;
      if (c >= '0' && c <= '9') {
        n = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        n = c - 'a' + 10;
      } else {
        return std::nullopt;
      }
      v = v * 16 + n;
    }
    d[i] = static_cast<uint8_t>(v);
  }
  return d;
}

// As ssh refuses a loose ~/.ssh: a directory another user may write to, or owns, lets that
// user plant, replace or delete block files (a block is checked against its key, but a
// planted link or a swapped file is still a way in). Owned by this user or root, and
// writable by neither group nor others.
absl::Status CheckDirectoryOwnership(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot stat cache dir %s: %s", dir, ErrnoText(errno)));
  }
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cache dir %s is owned by uid %d, not by this user (uid %d) or root: another user "
        "could replace its block files; chown it or choose another",
        dir, st.st_uid, me));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cache dir %s is writable by %s (mode %04o): another user could plant or replace "
        "its block files; chmod go-w it or choose another",
        dir, (st.st_mode & S_IWOTH) != 0 ? "everyone" : "its group", st.st_mode & 07777));
  }
  return absl::OkStatus();
}

// DIR/LOCK, opened for the flock and the pid it holds: never through a symbolic link, and
// only a regular file with no other name (a hard link planted there would have the pid
// written into a file elsewhere). A descriptor, or -errno (-EEXIST for a link).
int OpenLockFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return errno == ELOOP ? -EEXIST : -errno;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd);
    return -EEXIST;
  }
  return fd;
}

int64_t MtimeNanos(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options,
                                                         const BlockLayout& layout) {
  if (absl::Status s = ValidateBlockLayout(layout); !s.ok()) return s;
  if (options.dir.empty()) return absl::InvalidArgumentError("disk tier: empty directory");
  if (options.max_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cache-dir-bytes must be 0 (the default cap) or positive, got ", options.max_bytes));
  }
  if (options.max_queued_blocks <= 0 || options.max_load_blocks <= 0) {
    return absl::InvalidArgumentError(
        "disk tier: max_queued_blocks and max_load_blocks must be positive");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create cache dir %s: %s; create it or choose another", options.dir, ec.message()));
  }
  if (absl::Status s = CheckDirectoryOwnership(options.dir); !s.ok()) return s;
  const std::string lock_path = options.dir + "/" + kLockName;
  const int fd = OpenLockFile(lock_path);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cache dir %s is not writable (%s: %s); fix its permissions or choose another",
        options.dir, lock_path,
        fd == -EEXIST ? "not a regular file of its own (a link?)" : ErrnoText(-fd)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {0};
    const ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cache dir %s is in use by another prefixd process (pid %s holds %s); give each "
          "process its own cache dir",
          options.dir, n > 0 ? std::string(pid, n) : "unknown", lock_path));
    }
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot lock %s: %s", lock_path, ErrnoText(err)));
  }
  // The pid, for the message above; the lock is what counts.
  const std::string pid = absl::StrCat(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "cache dir %s is not writable (%s: %s); fix its permissions or choose another", options.dir,
        lock_path, ErrnoText(err)));
  }
  // A directory whose LOCK file is writable may still refuse new files.
  const std::string probe = options.dir + "/probe" + kTempSuffix;
  if (int err = WriteFileAtomically(options.dir + "/probe.w" + kTempSuffix, probe, "probe", 0644);
      err != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("cache dir %s is not writable (%s); fix its permissions or choose another",
                        options.dir, ErrnoText(err)));
  }
  ::unlink(probe.c_str());
  int64_t cap = options.max_bytes;
  if (cap == 0) {
    struct statvfs fs;
    if (::statvfs(options.dir.c_str(), &fs) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrFormat("cannot read free space of %s: %s", options.dir, ErrnoText(err)));
    }
    const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * fs.f_frsize;
    cap = std::min(kDefaultDiskTierMaxBytes, free_bytes / 2);
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(options, layout, fd, cap));
  if (absl::Status s = tier->Scan(); !s.ok()) return s;
  tier->writer_ = std::thread([t = tier.get()] { t->WriterLoop(); });
  tier->loader_ = std::thread([t = tier.get()] { t->LoaderLoop(); });
  return tier;
}

DiskTier::DiskTier(const DiskTierOptions& options, const BlockLayout& layout, int lock_fd,
                   int64_t cap)
    : dir_(options.dir),
      layout_(layout),
      layout_id_(layout.Id()),
      max_queued_(options.max_queued_blocks),
      clock_(options.clock ? options.clock : [] { return absl::ToUnixNanos(absl::Now()); }),
      write_file_(options.write_file ? options.write_file
                                     : [](const std::string& tmp, const std::string& path,
                                          std::string_view bytes) {
                                         return WriteFileAtomically(tmp, path, bytes, 0644);
                                       }),
      read_hook_(options.read_hook),
      on_store_(options.on_store),
      on_delete_(options.on_delete),
      lock_fd_(lock_fd),
      cap_(cap),
      max_load_blocks_(options.max_load_blocks) {
  stats_.cap_bytes = cap;
}

DiskTier::~DiskTier() {
  std::deque<PendingFetch> left;
  {
    absl::MutexLock lock(&load_mu_);
    loader_stop_ = true;
    left.swap(fetches_);
  }
  if (loader_.joinable()) loader_.join();
  // Ended with nothing read; outside load_mu_: a fetch's deleter returns its budget under it.
  for (PendingFetch& p : left) p.fetch->done_.store(true, std::memory_order_release);
  left.clear();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (writer_.joinable()) writer_.join();
  ::close(lock_fd_);  // releases the flock
}

std::string DiskTier::PathOf(const Digest& key) const {
  return absl::StrCat(dir_, "/", layout_id_, "-", DigestHex(key), kBlockSuffix);
}

absl::Status DiskTier::Scan() {
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot list cache dir %s: %s", dir_, ErrnoText(errno)));
  }
  absl::MutexLock lock(&mu_);
  while (const struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string path = dir_ + "/" + name;
    if (absl::EndsWith(name, kTempSuffix)) {
      ::unlink(path.c_str());  // a write cut short by a crash
      continue;
    }
    if (!absl::EndsWith(name, kBlockSuffix)) continue;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const std::string_view stem(name.data(), name.size() - std::strlen(kBlockSuffix));
    std::optional<Digest> key;
    if (stem.size() == 16 + 1 + 64 && stem.substr(0, 16) == layout_id_ && stem[16] == '-') {
      key = ParseHexDigest(stem.substr(17));
    }
    if (key.has_value()) {
      index_.Add(*key, st.st_size, MtimeNanos(st));
    } else {
      index_.AddForeign(name, st.st_size, MtimeNanos(st));
    }
  }
  ::closedir(d);
  MakeRoomLocked(0);
  if (on_store_) ReportFoundLocked();
  found_reported_ = true;
  return absl::OkStatus();
}

void DiskTier::ReportFoundLocked() {
  std::vector<BlockRecordHead> heads;
  std::string buffer;
  for (const Digest& key : index_.OwnKeys()) {
    const std::string path = PathOf(key);
    const int err =
        ReadFilePrefixInto(path, static_cast<size_t>(BlockRecordHeadBytes(layout_)), &buffer);
    if (err == ENOENT) {  // gone since the scan: nothing to report
      index_.Erase(key);
      continue;
    }
    absl::StatusOr<BlockRecordHead> head =
        err != 0 ? absl::DataLossError(ErrnoText(err)) : DecodeBlockRecordHead(buffer, layout_);
    // The file must be the block its name says, of the size its header says.
    if (!head.ok() || head->key != key ||
        index_.BytesOf(key) !=
            (head->scored ? layout_.scored_record_bytes() : layout_.record_bytes())) {
      index_.Erase(key);
      ::unlink(path.c_str());
      ++stats_.corrupt_blocks;
      continue;
    }
    heads.push_back(*std::move(head));
  }
  OrderParentsFirst(&heads);
  for (const BlockRecordHead& h : heads) on_store_(h);
}

void DiskTier::ReportDeletedLocked(const Digest& key) {
  if (on_delete_ && found_reported_) on_delete_(key);
}

void DiskTier::MakeRoomLocked(int64_t incoming) {
  while (std::optional<TierIndex::Victim> v = index_.PopVictim(cap_, incoming)) {
    const std::string path = v->foreign ? dir_ + "/" + v->name : PathOf(v->key);
    ::unlink(path.c_str());  // best effort: a file already gone frees its bytes all the same
    ++stats_.evicted_files;
    if (!v->foreign) ReportDeletedLocked(v->key);
  }
}

size_t DiskTier::MatchFrom(absl::Span<const Digest> keys) const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  while (n < keys.size() && index_.Contains(keys[n])) ++n;
  return n;
}

bool DiskTier::ScoredLocked(const Digest& key) const {
  return layout_.score_top_k > 0 && index_.BytesOf(key) == layout_.scored_record_bytes();
}

size_t DiskTier::MatchScoredFrom(absl::Span<const Digest> keys) const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  while (n < keys.size() && ScoredLocked(keys[n])) ++n;
  return n;
}

bool DiskTier::Contains(const Digest& key) const {
  absl::MutexLock lock(&mu_);
  return index_.Contains(key);
}

void DiskTier::Prefetch(absl::Span<const Digest> keys) const {
  for (const Digest& key : keys) {
    const int fd = ::open(PathOf(key).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
    ::close(fd);
  }
}

absl::Status DiskTier::Load(const BlockExpectation& expect, absl::Span<uint8_t> out,
                            std::vector<PositionScore>* scores) {
  PREFIXD_CHECK(static_cast<int64_t>(out.size()) == layout_.data_bytes());
  {
    absl::MutexLock lock(&mu_);
    if (!index_.Contains(expect.key)) return absl::NotFoundError("block not in the disk tier");
  }
  if (read_hook_) read_hook_();
  const std::string path = PathOf(expect.key);
  const int err = ReadFileInto(path, &load_buffer_);
  if (err == ENOENT) {
    // Deleted for the cap by the writer since the lookup: a miss, not damage.
    absl::MutexLock lock(&mu_);
    if (index_.Erase(expect.key)) ReportDeletedLocked(expect.key);
    return absl::NotFoundError("block left the disk tier");
  }
  absl::StatusOr<absl::Span<const uint8_t>> data =
      err != 0 ? absl::DataLossError(absl::StrCat("cannot read ", path, ": ", ErrnoText(err)))
               : DecodeBlockRecord(load_buffer_, layout_, expect, scores);
  absl::MutexLock lock(&mu_);
  if (!data.ok()) {
    if (index_.Erase(expect.key)) {
      ::unlink(path.c_str());
      ReportDeletedLocked(expect.key);
    }
    ++stats_.corrupt_blocks;
    return data.status();
  }
  std::memcpy(out.data(), data->data(), out.size());
  index_.Touch(expect.key, Now());
  // The LRU order survives a restart (a link swapped in meanwhile: its own times).
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
  ++stats_.loads;
  return absl::OkStatus();
}
absl::StatusOr<std::shared_ptr<const TierMatch>> DiskTier::StartMatch(
    absl::Span<const Digest> keys, const MatchOptions& match,
    std::function<void()> /*on_done: answered before returning*/) {
  auto m = std::make_shared<TierMatch>();
  m->scored_only = match.scored_only;
  m->blocks = match.scored_only ? MatchScoredFrom(keys) : MatchFrom(keys);
  m->keys.assign(keys.begin(), keys.begin() + m->blocks);
  m->done_.Notify();
  return m;
}

absl::StatusOr<std::shared_ptr<const TierFetch>> DiskTier::StartFetch(
    FetchRequest request, std::function<void()> on_done) {
  const int64_t n = static_cast<int64_t>(request.keys.size());
  PREFIXD_CHECK(n > 0 && n <= max_load_blocks_);
  PREFIXD_CHECK(request.tokens.size() == request.keys.size() * layout_.block_size);
  absl::MutexLock lock(&load_mu_);
  if (loader_stop_) return absl::UnavailableError("the disk tier is shutting down");
  if (fetch_blocks_in_flight_ + n > max_load_blocks_) {
    return absl::ResourceExhaustedError("the disk tier's load budget is in use");
  }
  fetch_blocks_in_flight_ += n;
  // The budget comes back when the last holder (the request, or the loader) lets go. The
  // tier outlives every fetch: the engine drops its loads before its tiers.
  std::shared_ptr<TierFetch> f(new TierFetch, [this, n](TierFetch* done) {
    delete done;
    absl::MutexLock l(&load_mu_);
    fetch_blocks_in_flight_ -= n;
  });
  f->root = request.root;
  f->keys = std::move(request.keys);
  f->tokens = std::move(request.tokens);
  f->scored_only = request.scored_only;
  fetches_.push_back({f, std::move(on_done)});
  return f;
}

void DiskTier::LoaderLoop() {
  while (true) {
    PendingFetch p;
    {
      absl::MutexLock lock(&load_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_) {
        return !fetches_.empty() || loader_stop_;
      };
      load_mu_.Await(absl::Condition(&ready));
      if (loader_stop_) return;
      p = std::move(fetches_.front());
      fetches_.pop_front();
    }
    Read(*p.fetch, p.fetch);
    p.fetch->done_.store(true, std::memory_order_release);
    // This thread lets go first, so that whoever on_done wakes holds the only reference.
    std::function<void()> on_done = std::move(p.on_done);
    p = PendingFetch();
    if (on_done) on_done();
  }
}

void DiskTier::Read(TierFetch& f, const std::shared_ptr<TierFetch>& held) {
  const size_t bs = layout_.block_size;
  // The kernel reads the files ahead while the first ones are verified.
  Prefetch(f.keys);
  for (size_t i = 0; i < f.keys.size(); ++i) {
    {
      absl::MutexLock lock(&load_mu_);
      if (loader_stop_) break;
    }
    // Nobody waits for it any more (the request was cancelled or ended): stop reading.
    if (held.use_count() == 1) break;
    const absl::Time t0 = absl::Now();
    std::vector<uint8_t> data(static_cast<size_t>(layout_.data_bytes()));
    std::vector<PositionScore> section;
    const BlockExpectation expect{.root = f.root,
                                  .key = f.keys[i],
                                  .tokens = absl::MakeConstSpan(f.tokens).subspan(i * bs, bs)};
    // Absent (deleted for the cap since the match) or corrupt (deleted and counted): this
    // block and every one after it are computed.
    if (!Load(expect, absl::MakeSpan(data), &section).ok()) break;
    // A scoring request matched scored files only; one that lost its section (replaced
    // meanwhile) ends its fetch.
    if (f.scored_only && section.empty()) break;
    f.values.push_back(std::move(data));
    f.data.push_back(f.values.back());
    f.scores.push_back(std::move(section));
    f.seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  // Each Load made its block the most recently used, so the chain's first block is now the
  // least recently used of them, and the cap's next victim: a match stops at it, and every
  // block after it would stay on disk, unreachable. Touched again deepest first, the chain
  // leaves from its end, as the pool evicts leaves before parents (and spills them so).
  absl::MutexLock lock(&mu_);
  for (size_t i = f.data.size(); i-- > 0;) index_.Touch(f.keys[i], Now());
}

bool DiskTier::WantsSpill(const Digest& key, const SpillIntent& spill) {
  const absl::Time deadline = spill.deadline;
  absl::MutexLock lock(&mu_);
  if (queued_keys_.contains(key)) return false;
  if (index_.Contains(key) && !(spill.scored && !ScoredLocked(key))) {
    // The pool evicts it now, so it was in use until now: its file is as recent. The pool
    // evicts leaves before parents, so a chain's first blocks stay the most recent here too,
    // and the cap deletes a chain from its end (a match stops at the first block missing).
    // In the index only: the engine thread does no file I/O here.
    index_.Touch(key, Now());
    return false;
  }
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int32_t>(queue_.size()) < max_queued_ || stop_;
  };
  if (!room() && deadline > absl::Now()) mu_.AwaitWithDeadline(absl::Condition(&room), deadline);
  if (static_cast<int32_t>(queue_.size()) >= max_queued_ || stop_) {
    ++stats_.spills_dropped;
    return false;
  }
  return true;
}

void DiskTier::Spill(BlockRecord record) {
  PREFIXD_CHECK(record.tokens.size() == layout_.block_size);
  PREFIXD_CHECK(static_cast<int64_t>(record.data.size()) == layout_.data_bytes());
  absl::MutexLock lock(&mu_);
  PREFIXD_CHECK(static_cast<int32_t>(queue_.size()) < max_queued_);
  PREFIXD_CHECK(queued_keys_.insert(record.key).second);
  PREFIXD_CHECK(!index_.Contains(record.key) ||
                (!record.scores.empty() && !ScoredLocked(record.key)));
  queue_.push_back(std::move(record));
}

bool DiskTier::Flush(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (queue_.empty() && !writing_) || stop_;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline) && queue_.empty() && !writing_;
}

void DiskTier::WriterLoop() {
  while (true) {
    int64_t file_bytes = 0;
    bool replacing = false;  // a file without scores is on disk under the key
    BlockRecord record;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stop_; };
      mu_.Await(absl::Condition(&ready));
      if (stop_) {
        stats_.spills_dropped += queue_.size();
        queue_.clear();
        queued_keys_.clear();
        return;
      }
      record = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      file_bytes = record.scores.empty() ? layout_.record_bytes() : layout_.scored_record_bytes();
      // A file without scores that this one replaces (invariant 2): its bytes leave the index
      // now; the rename below replaces it, or the failure path deletes it.
      replacing = index_.Erase(record.key);
      // Room first, so the directory never holds more than the cap.
      MakeRoomLocked(file_bytes);
    }
    bool fits;
    {
      absl::MutexLock lock(&mu_);
      fits = index_.bytes() + file_bytes <= cap_;
    }
    int err = 0;
    const std::string path = PathOf(record.key);
    if (fits) {
      const std::string bytes = EncodeBlockRecord(layout_, record);
      err = write_file_(path + kTempSuffix, path, bytes);
    }
    absl::MutexLock lock(&mu_);
    writing_ = false;
    queued_keys_.erase(record.key);
    if (!fits || err != 0) {
      ::unlink(path.c_str());  // the replaced file, if any: no longer indexed
      if (replacing) ReportDeletedLocked(record.key);
      ++stats_.spills_dropped;
      if (err != 0) ++stats_.write_errors;
      continue;
    }
    index_.Add(record.key, file_bytes, Now());
    if (on_store_ && !replacing) {
      on_store_(BlockRecordHead{.root = record.root,
                                .parent_key = record.parent_key,
                                .key = record.key,
                                .tokens = std::move(record.tokens),
                                .scored = !record.scores.empty()});
    }
    ++stats_.spills;
    MakeRoomLocked(0);  // a load's Touch cannot grow it, but keep the invariant local
  }
}

DiskTierStats DiskTier::Stats() const {
  absl::MutexLock lock(&mu_);
  DiskTierStats s = stats_;
  s.blocks = index_.own_blocks();
  s.bytes = index_.bytes();
  s.foreign_files = index_.foreign_files();
  s.queued_blocks = static_cast<int64_t>(queue_.size()) + (writing_ ? 1 : 0);
  return s;
}

}  // namespace prefixd
