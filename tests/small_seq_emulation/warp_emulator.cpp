#include "warp_emulator.h"

#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/cuda_runtime.h"

namespace emulation {
namespace {

struct Warp {
  explicit Warp(int lanes) : barrier(lanes) {}
  std::barrier<> barrier;
  float values[32] = {};
};

struct Block {
  explicit Block(unsigned threads) : barrier(static_cast<std::ptrdiff_t>(threads)) {
    for (unsigned first = 0; first < threads; first += 32)
      warps.push_back(std::make_unique<Warp>(static_cast<int>(std::min(32u, threads - first))));
  }
  std::barrier<> barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

thread_local dim3 t_thread, t_block, t_dim;
thread_local Warp* t_warp = nullptr;
thread_local Block* t_block_state = nullptr;
std::mutex g_atomics;

}  // namespace

const dim3& ThreadIdx() { return t_thread; }
const dim3& BlockIdx() { return t_block; }
const dim3& BlockDim() { return t_dim; }
int Lane() { return static_cast<int>(t_thread.x % 32); }

float ShuffleFrom(float value, int source_lane) {
  Warp& warp = *t_warp;
  warp.values[Lane()] = value;
  warp.barrier.arrive_and_wait();
  float result = warp.values[source_lane];
  warp.barrier.arrive_and_wait();
  return result;
}

void SyncBlock() { t_block_state->barrier.arrive_and_wait(); }

int AtomicMax(int* address, int value) {
  std::lock_guard<std::mutex> lock(g_atomics);
  int old = *address;
  if (value > old) *address = value;
  return old;
}

unsigned int AtomicMin(unsigned int* address, unsigned int value) {
  std::lock_guard<std::mutex> lock(g_atomics);
  unsigned int old = *address;
  if (value < old) *address = value;
  return old;
}

void CheckAligned(const void* address, size_t alignment) {
  if (reinterpret_cast<uintptr_t>(address) % alignment != 0) {
    std::fprintf(stderr, "emulation: misaligned %zu-byte access at %p\n", alignment, address);
    std::abort();
  }
}

void Launch(unsigned grid, unsigned block_threads, const std::function<void()>& kernel) {
  Block block(block_threads);
  std::vector<std::thread> threads;
  threads.reserve(block_threads);
  for (unsigned t = 0; t < block_threads; ++t) {
    threads.emplace_back([&, t] {
      t_thread = dim3{t, 0, 0};
      t_dim = dim3{block_threads, 1, 1};
      t_warp = block.warps[t / 32].get();
      t_block_state = &block;
      for (unsigned g = 0; g < grid; ++g) {
        t_block = dim3{g, 0, 0};
        kernel();
        block.barrier.arrive_and_wait();  // the next block reuses the threads (and __shared__)
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

}  // namespace emulation
