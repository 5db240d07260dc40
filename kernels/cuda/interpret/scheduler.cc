#include "kernels/cuda/interpret/scheduler.h"

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace prefixd::cuda_interpret {
namespace {

namespace ctx = boost::context;

// A fiber's stack: 256 KiB (kernels keep a few registers' worth of locals, but AddressSanitizer
// frames are several times larger) above one guard page, mapped once and reused: a launch
// creates one fiber per thread of every block.
constexpr size_t kStackBytes = 256 << 10;

class StackPool {
 public:
  ~StackPool() {
    for (void* base : free_) munmap(base, kStackBytes + Page());
  }
  ctx::stack_context Take() {
    void* base;
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    } else {
      base = mmap(nullptr, kStackBytes + Page(), PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      mprotect(base, Page(), PROT_NONE);  // the guard page below the stack
      mapped_.push_back(base);
    }
    ctx::stack_context sc;
    sc.sp = static_cast<char*>(base) + Page() + kStackBytes;  // stacks grow down
    sc.size = kStackBytes;
    return sc;
  }
  void Give(const ctx::stack_context& sc) {
    free_.push_back(static_cast<char*>(sc.sp) - kStackBytes - Page());
  }
  // Clears AddressSanitizer's shadow of every stack, before the suspended threads of a failed
  // block are unwound. ASan does not know these stacks, so the throw that unwinds a fiber
  // cannot unpoison what lies below it (it warns that it ignores __asan_handle_no_return),
  // and its own sigaltstack call in that frame then meets stale scope poison from frames the
  // fiber left: a false stack-use-after-scope that would kill the process in place of the
  // sticky launch failure. Only stack-bug detection in the dying threads is given up.
  void UnpoisonAll() {
#if defined(__SANITIZE_ADDRESS__)
    for (void* base : mapped_)
      ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(base) + Page(), kStackBytes);
#endif
  }

 private:
  static size_t Page() {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
  }
  std::vector<void*> free_;
  std::vector<void*> mapped_;  // every stack, free or in use
};

thread_local StackPool stack_pool;

struct PooledStack {
  ctx::stack_context allocate() { return stack_pool.Take(); }
  void deallocate(ctx::stack_context& sc) noexcept { stack_pool.Give(sc); }
};

enum class State { kRunnable, kAtBarrier, kAtWarp, kDone };

struct Thread {
  uint3 idx{};
  State state = State::kRunnable;
  ctx::fiber fiber;  // the thread itself, suspended (empty once done)
  ctx::fiber sink;   // the scheduler, while the thread runs
  uint64_t exchange_generation = 0;
};

struct Warp {
  int arrived = 0;
  uint64_t generation = 0;
  // Double-buffered by generation parity: a lane writes exchange g + 2 only after passing
  // exchange g + 1, which every lane reaches only after reading exchange g.
  std::array<std::array<uint64_t, 32>, 2> values{};
};

struct Block {
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  int live = 0;
  int at_barrier = 0;
  int exited = 0;
  std::string error;
};

thread_local Block* current_block = nullptr;
thread_local Thread* current_thread = nullptr;

std::string Where(const Thread& t) {
  return absl::StrFormat("block (%u, %u, %u) thread (%u, %u, %u)", blockIdx.x, blockIdx.y,
                         blockIdx.z, t.idx.x, t.idx.y, t.idx.z);
}

// Hands control back to the scheduler; returns when the scheduler resumes this thread.
void Suspend(Thread& t) {
  t.sink = std::move(t.sink).resume();
  // Resumed: current_thread and the coordinates were set by the scheduler.
}

// Fails the launch from inside a thread: the scheduler sees the error and unwinds the block.
[[noreturn]] void FailFromThread(Block& b, Thread& t, std::string message) {
  if (b.error.empty()) b.error = absl::StrCat(Where(t), ": ", message);
  for (;;) {
    t.state = State::kAtBarrier;  // never released: the scheduler stops at the error
    Suspend(t);
  }
}

void OnExit(Block& b, Thread& t) {
  t.state = State::kDone;
  --b.live;
  ++b.exited;
  if (b.at_barrier > 0 && b.error.empty()) {
    b.error = absl::StrFormat(
        "%s exited while %d threads of its block wait at __syncthreads, which it can no longer "
        "reach (a barrier in divergent code: undefined behaviour in CUDA)",
        Where(t), b.at_barrier);
  }
  const size_t w = &t - b.threads.data();
  if (b.warps[w / 32].arrived > 0 && b.error.empty()) {
    b.error = absl::StrFormat(
        "%s exited while %d lanes of its warp wait for it in a warp shuffle or __syncwarp",
        Where(t), b.warps[w / 32].arrived);
  }
}

}  // namespace

void SyncThreads() {
  Block& b = *current_block;
  Thread& t = *current_thread;
  if (b.exited > 0) {
    FailFromThread(b, t,
                   absl::StrFormat("__syncthreads after %d threads of the block exited (a barrier "
                                   "in divergent code: undefined behaviour in CUDA)",
                                   b.exited));
  }
  if (++b.at_barrier == b.live) {
    b.at_barrier = 0;
    for (Thread& other : b.threads) {
      if (other.state == State::kAtBarrier) other.state = State::kRunnable;
    }
    return;
  }
  t.state = State::kAtBarrier;
  Suspend(t);
}

uint64_t WarpExchange(unsigned int mask, uint64_t bits, int src_lane) {
  Block& b = *current_block;
  Thread& t = *current_thread;
  const size_t linear = &t - b.threads.data();
  const size_t warp_begin = linear / 32 * 32;
  if (mask != 0xffffffffu) {
    FailFromThread(b, t,
                   absl::StrFormat("warp operation with mask 0x%08x: the interpreter takes only "
                                   "whole warps (0xffffffff)",
                                   mask));
  }
  if (warp_begin + 32 > b.threads.size()) {
    FailFromThread(b, t,
                   absl::StrFormat("warp operation with mask 0xffffffff in a warp of %d lanes "
                                   "(the block has %d threads): lanes named in the mask do not "
                                   "exist, undefined behaviour in CUDA",
                                   b.threads.size() - warp_begin, b.threads.size()));
  }
  for (size_t i = warp_begin; i < warp_begin + 32; ++i) {
    if (b.threads[i].state == State::kDone) {
      FailFromThread(b, t,
                     absl::StrFormat("warp operation with mask 0xffffffff after lane %d of the "
                                     "warp exited",
                                     i - warp_begin));
    }
  }
  Warp& w = b.warps[linear / 32];
  const uint64_t generation = w.generation;
  auto& values = w.values[generation & 1];
  values[linear - warp_begin] = bits;
  if (++w.arrived == 32) {
    w.arrived = 0;
    ++w.generation;
    for (size_t i = warp_begin; i < warp_begin + 32; ++i) {
      if (b.threads[i].state == State::kAtWarp) b.threads[i].state = State::kRunnable;
    }
  } else {
    t.state = State::kAtWarp;
    Suspend(t);
  }
  return values[static_cast<size_t>(src_lane) & 31];
}

std::string RunGrid(dim3 grid, dim3 block, const std::function<void()>& body) {
  const unsigned n = block.x * block.y * block.z;
  Block b;
  gridDim = grid;
  blockDim = block;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = {bx, by, bz};
        b.threads.clear();
        b.threads.resize(n);
        b.warps.assign((n + 31) / 32, Warp{});
        b.live = static_cast<int>(n);
        b.at_barrier = 0;
        b.exited = 0;
        for (unsigned i = 0; i < n; ++i) {
          Thread& t = b.threads[i];
          t.idx = {i % block.x, i / block.x % block.y, i / (block.x * block.y)};
          t.fiber =
              ctx::fiber(std::allocator_arg, PooledStack{}, [&b, &t, &body](ctx::fiber&& sink) {
                t.sink = std::move(sink);
                body();
                OnExit(b, t);
                return std::move(t.sink);
              });
        }
        Block* const outer_block = current_block;
        Thread* const outer_thread = current_thread;
        current_block = &b;
        size_t done = 0;
        while (b.error.empty() && done < n) {
          bool progress = false;
          for (Thread& t : b.threads) {
            if (t.state != State::kRunnable) continue;
            current_thread = &t;
            threadIdx = t.idx;
            t.fiber = std::move(t.fiber).resume();
            progress = true;
            if (t.state == State::kDone) ++done;
            if (!b.error.empty()) break;
          }
          if (!progress && b.error.empty()) {
            int barrier = 0, warp = 0;
            for (const Thread& t : b.threads) {
              barrier += t.state == State::kAtBarrier;
              warp += t.state == State::kAtWarp;
            }
            b.error = absl::StrFormat(
                "block (%u, %u, %u) deadlocked: %d threads wait at __syncthreads and %d at warp "
                "exchanges that can never complete",
                blockIdx.x, blockIdx.y, blockIdx.z, barrier, warp);
          }
        }
        // A failed block's suspended threads are unwound when their fibers are destroyed.
        if (!b.error.empty()) stack_pool.UnpoisonAll();
        b.threads.clear();
        current_block = outer_block;
        current_thread = outer_thread;
        if (!b.error.empty()) return b.error;
      }
    }
  }
  return {};
}

}  // namespace prefixd::cuda_interpret
