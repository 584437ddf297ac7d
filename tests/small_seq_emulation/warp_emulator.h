// Runs CUDA kernel code on the CPU: every thread of a block is an OS thread, blocks run one after
// another. Shuffles exchange values among the 32 threads of a warp through a barrier, so the
// emulated warp is in lockstep at every shuffle exactly as the code requires of a real one.
#pragma once

#include <functional>

namespace emulation {

// Calls kernel() once per thread of `grid` blocks of `block_threads` threads, with threadIdx,
// blockIdx and blockDim set.
void Launch(unsigned grid, unsigned block_threads, const std::function<void()>& kernel);

}  // namespace emulation
