// bench_engine --vs-bound: batch-1 decode of a model against the machine's memory bound, measured
// in the same run. A decode step reads every weight once, so its speed is bounded by how fast
// those bytes can be read: the bound is the faster of two streaming reads of the weights' own
// pages (one stream a thread, SumStreaming; or eight side by side, as the decode kernel reads),
// and the table gives decode's GB/s of weight bytes over it. A read of a fresh buffer as large is
// printed beside it: on a VM where the host puts a buffer's pages and the weights' differs.
// Thread-compatible (run from main).
#ifndef CONNEX_BENCH_ENGINE_VS_BOUND_H_
#define CONNEX_BENCH_ENGINE_VS_BOUND_H_

#include <string>
#include <vector>

#include "connex/engine/model_config.h"

namespace connex::engine {

struct VsBoundOptions {
  ModelConfig config;  // shapes; set by the flags
  std::vector<std::string> dtypes = {"bf16", "f32"};
  // Where the streamed weights live ("mapped", "copied"): each dtype is loaded once each way and
  // measured in turn, in the same rounds. Empty: CONNEX_ENGINE_WEIGHTS's choice alone.
  std::vector<std::string> weights;
  int threads = 0;  // 0: the hardware concurrency
  int rounds = 5;   // each round: bound, decode, per dtype in turn
  int tokens = 32;  // decode steps timed per round
  // The prompt of the prefill timed per round (one step; 0: none). Prefill computes on every
  // token at once: its step is compared with one pass over the weights at the bound.
  int prefill_tokens = 128;
  // Time the bound and decode on the thread's CPU clock instead of the wall clock (one thread
  // only): on a machine shared with other processes, how fast the code streams while it runs.
  bool cpu_time = false;
  // Where the models are written and kept, and reused when there with the same shape; empty: a
  // temporary directory, removed at the end.
  std::string model_dir;
};

// Llama-3.2-1B's widths (hidden 2048, SwiGLU 8192, 32 heads, 8 KV heads) with 2 layers and a
// 32,000-token vocabulary: 374 MB of BF16 weights per decode step, far beyond the caches.
// The sum of data[0..n), read as fast as memory gives it to one thread: the memory bound's read
// (--vs-bound's and BM_StreamRead's).
uint64_t SumStreaming(const uint64_t* data, int64_t n);

ModelConfig VsBoundDefaultConfig();

// Writes the models (seeded random weights), measures, prints the table. Returns the process exit
// code.
int RunDecodeVsBound(const VsBoundOptions& options);

}  // namespace connex::engine

#endif  // CONNEX_BENCH_ENGINE_VS_BOUND_H_
