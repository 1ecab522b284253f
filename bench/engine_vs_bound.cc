#include "bench/engine_vs_bound.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <sstream>
#include <thread>

#include "benchmark/benchmark.h"
#include "connex/base/strings.h"
#include "connex/engine/pipeline.h"
#include "connex/engine/prefetch.h"
#include "connex/engine/random_model.h"
#include "connex/engine/stage_engine.h"
#include "connex/engine/tokenizer.h"
#include "connex/engine/weight_memory.h"

namespace connex::engine {

// 16 lanes (the adds vectorise) and a software prefetch 2 KiB ahead: the fastest read of memory
// found on these machines (a plain sum read 45.7 GB/s where this one read 52.3, medians of 10
// passes, 2026-12-07).
uint64_t SumStreaming(const uint64_t* data, int64_t n) {
  constexpr int64_t kAhead = 256;  // elements: 2 KiB
  uint64_t lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __builtin_prefetch(data + i + kAhead);
    __builtin_prefetch(data + i + kAhead + 8);
    for (int j = 0; j < 16; ++j) lane[j] += data[i + j];
  }
  uint64_t sum = 0;
  for (; i < n; ++i) sum += data[i];
  for (uint64_t l : lane) sum += l;
  return sum;
}

namespace {

// The sum of [lo, hi): its aligned 8-byte words through SumStreaming, the bytes around them one
// by one.
uint64_t SumBytes(const char* lo, const char* hi) {
  const char* words = std::min(
      hi, reinterpret_cast<const char*>((reinterpret_cast<uintptr_t>(lo) + 7) & ~uintptr_t{7}));
  const int64_t n = (hi - words) / 8;
  uint64_t sum = SumStreaming(reinterpret_cast<const uint64_t*>(words), n);
  for (const char* c = lo; c < words; ++c) sum += static_cast<unsigned char>(*c);
  for (const char* c = words + 8 * n; c < hi; ++c) sum += static_cast<unsigned char>(*c);
  return sum;
}

// The sum of the 8-byte words of data[0..bytes) read as the decode kernel reads a matrix: blocks
// of eight 4 KiB rows side by side, each row prefetched 512 bytes ahead of its loads and, near
// its end, into the next block's row. On this machine it is at times faster than SumStreaming's
// one stream a thread, at times slower; the bound takes the faster.
uint64_t SumEightStreams(const char* data, int64_t bytes) {
  constexpr int64_t kRow = 4096, kRows = 8, kBlock = kRow * kRows, kAhead = 512;
  uint64_t lane[kRows][8] = {};
  int64_t b = 0;
  for (; b + kBlock <= bytes; b += kBlock) {
    const char* block = data + b;
    for (int64_t at = 0; at < kRow; at += 64) {
      const int64_t ahead = at + kAhead < kRow ? at + kAhead : at + kAhead + kBlock - kRow;
      for (int r = 0; r < kRows; ++r) PrefetchT0(block + r * kRow + ahead);
      for (int r = 0; r < kRows; ++r) {
        for (int j = 0; j < 8; ++j) {
          uint64_t word;
          std::memcpy(&word, block + r * kRow + at + 8 * j, sizeof(word));
          lane[r][j] += word;
        }
      }
    }
  }
  uint64_t sum = 0;
  for (const auto& row : lane) {
    for (uint64_t v : row) sum += v;
  }
  return sum + SumBytes(data + b, data + bytes);
}

// Seconds on the wall clock, or on this thread's CPU clock (--cpu-time, one thread: the time the
// thread ran, stalls on memory included, preemptions by other processes not).
double Now(bool cpu) {
  timespec ts;
  ::clock_gettime(cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// Field `name` of /proc/self/status, in bytes ("VmRSS", "RssAnon", "RssFile").
int64_t StatusBytes(const std::string& name) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(name.size() + 1));
    int64_t kb = 0;
    fields >> kb;
    return kb * 1024;
  }
  return 0;
}

// Bytes of the weights a batch-1 decode step reads: every matrix and norm except the embedding
// table, of which it reads one row.
int64_t DecodeWeightBytes(const ModelConfig& c, DType dtype) {
  const int64_t params = ParameterCount(c) - c.vocab_size * c.hidden_size + c.hidden_size;
  return params * static_cast<int64_t>(DTypeSize(dtype));
}

// The bound: `threads` threads each summing a contiguous part of `data` (SumStreaming) through
// the engine's own pool, GB/s of one pass.
double StreamReadGBps(ThreadPool& pool, const std::vector<uint64_t>& data, bool cpu) {
  const int64_t n = static_cast<int64_t>(data.size()), parts = pool.size();
  std::vector<uint64_t> sums(parts * 8);  // a cache line apart
  const double start = Now(cpu);
  pool.ParallelFor(parts, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t from = n * p / parts, to = n * (p + 1) / parts;
      sums[p * 8] = SumStreaming(data.data() + from, to - from);
    }
  });
  const double s = Now(cpu) - start;
  uint64_t total = 0;
  for (int64_t p = 0; p < parts; ++p) total += sums[p * 8];
  if (total != static_cast<uint64_t>(n)) std::abort();  // every element is 1: nothing skipped
  return static_cast<double>(n) * sizeof(uint64_t) / s / 1e9;
}

// One streaming pass over the very bytes a decode step reads (`regions`, the stages'
// StreamedWeights in their order): `threads` threads each summing a contiguous part of their
// concatenation, with SumStreaming (eight == false) or SumEightStreams; GB/s of the pass.
double StreamRegionsGBps(ThreadPool& pool, const std::vector<std::span<const char>>& regions,
                         bool eight, bool cpu) {
  int64_t total = 0;
  for (std::span<const char> r : regions) total += static_cast<int64_t>(r.size());
  const int64_t parts = pool.size();
  std::vector<uint64_t> sums(parts * 8);  // a cache line apart
  const double start = Now(cpu);
  pool.ParallelFor(parts, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t from = total * p / parts, to = total * (p + 1) / parts;
      uint64_t sum = 0;
      int64_t at = 0;  // where the region starts in the concatenation
      for (std::span<const char> r : regions) {
        const int64_t size = static_cast<int64_t>(r.size());
        const int64_t b = std::max(from, at), e = std::min(to, at + size);
        const char* lo = r.data() + (b - at);
        at += size;
        if (b >= e) continue;
        sum += eight ? SumEightStreams(lo, e - b) : SumBytes(lo, lo + (e - b));
      }
      sums[p * 8] = sum;
    }
  });
  const double s = Now(cpu) - start;
  uint64_t all = 0;
  for (int64_t p = 0; p < parts; ++p) all += sums[p * 8];
  benchmark::DoNotOptimize(all);  // the sums are used: no pass is optimised away
  return static_cast<double>(total) / s / 1e9;
}

TensorDict Step(int64_t id, int32_t start, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  TensorDict t;
  t.Set(kRequestIds, Tensor::Of<int64_t>({1}, std::vector<int64_t>{id}));
  t.Set(kStartPositions, Tensor::Of<int32_t>({1}, std::vector<int32_t>{start}));
  t.Set(kNumTokens, Tensor::Of<int32_t>({1}, std::vector<int32_t>{static_cast<int32_t>(n)}));
  t.Set(kTokens, Tensor::Of<int32_t>({n}, tokens));
  return t;
}

// One model under test: its file, pipeline, the bound's buffer (as large as its decode weights)
// and the figures of every round.
struct Subject {
  DType dtype;
  std::string label;  // the dtype, and where its weights live when several are measured
  std::string path;
  std::unique_ptr<Pipeline> pipeline;
  int64_t weight_bytes = 0;
  int64_t resident_bytes = 0;  // VmRSS growth over loading and the first steps
  int64_t file_bytes = 0;      // of which mapped file pages (RssFile)
  std::vector<uint64_t> buffer;
  std::vector<std::span<const char>> streamed;  // the weights' own bytes, as a step reads them
  // bound_gbps: of the weights' own pages, the ratio's denominator; buffer_gbps: of a fresh
  // buffer as large, for comparison.
  std::vector<double> bound_gbps, buffer_gbps, decode_tps, prefill_s;
};

// A fresh prompt of `tokens` tokens in one step; its seconds.
double PrefillSeconds(Pipeline& pipeline, int tokens, bool cpu) {
  std::vector<int32_t> prompt = Tokenize("Prefill streams the weights once.", /*add_bos=*/true);
  prompt.resize(static_cast<size_t>(tokens), 'y');
  pipeline.Release(2);
  const double start = Now(cpu);
  auto out = pipeline.Step(Step(2, 0, prompt));
  const double seconds = Now(cpu) - start;
  if (!out.ok()) std::abort();
  pipeline.Release(2);
  return seconds;
}

// A fresh 16-token prompt, then `tokens` decode steps; the median step time. `before_each` runs
// before each step, outside its time.
double DecodeTokensPerSecond(Pipeline& pipeline, int tokens, bool cpu,
                             const std::function<void()>& before_each = {}) {
  std::vector<int32_t> prompt = Tokenize("Streaming weights.", /*add_bos=*/true);
  prompt.resize(16, 'x');
  pipeline.Release(1);
  auto out = pipeline.Step(Step(1, 0, prompt));
  if (!out.ok()) std::abort();
  int32_t next = out->Find(kNextTokens)->values<int32_t>()[0];
  std::vector<double> seconds;
  for (int i = 0; i < tokens; ++i) {
    if (before_each) before_each();
    const double start = Now(cpu);
    out = pipeline.Step(Step(1, static_cast<int32_t>(prompt.size()) + i, {next}));
    seconds.push_back(Now(cpu) - start);
    if (!out.ok()) std::abort();
    next = out->Find(kNextTokens)->values<int32_t>()[0];
  }
  return 1.0 / Median(seconds);
}

std::string Range(const std::vector<double>& v, const char* format) {
  char buf[96];
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  std::snprintf(buf, sizeof(buf), format, Median(v));
  std::string out = buf;
  std::snprintf(buf, sizeof(buf), format, *lo);
  out += std::string(" (") + buf;
  std::snprintf(buf, sizeof(buf), format, *hi);
  return out + "-" + buf + ")";
}

}  // namespace

ModelConfig VsBoundDefaultConfig() {
  ModelConfig c;
  c.num_hidden_layers = 2;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.vocab_size = 32000;
  c.rope_theta = 500000.0;
  return c;
}

int RunDecodeVsBound(const VsBoundOptions& options) {
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto pool = std::make_shared<ThreadPool>(threads);
  char dir_template[] = "/tmp/connex-vs-bound.XXXXXX";
  const bool keep = !options.model_dir.empty();
  if (!keep && ::mkdtemp(dir_template) == nullptr) {
    std::perror("bench_engine: mkdtemp");
    return 1;
  }
  const std::string dir = keep ? options.model_dir : dir_template;
  const ModelConfig& c = options.config;
  std::vector<WeightMemory> memories;
  std::string memory_names;
  for (const std::string& name : options.weights) {
    absl::StatusOr<WeightMemory> m = ParseWeightMemory(name);
    if (!m.ok()) {
      std::fprintf(stderr, "bench_engine: --weights: %s\n",
                   std::string(m.status().message()).c_str());
      return 2;
    }
    memories.push_back(*m);
  }
  if (memories.empty()) {
    absl::StatusOr<WeightMemory> m = WeightMemoryFromEnv();
    if (!m.ok()) {
      std::fprintf(stderr, "bench_engine: %s\n", std::string(m.status().message()).c_str());
      return 2;
    }
    memories.push_back(*m);
    memory_names = StrCat(WeightMemoryName(*m), " (CONNEX_ENGINE_WEIGHTS)");
  } else {
    for (WeightMemory m : memories) {
      memory_names += StrCat(memory_names.empty() ? "" : ", ", WeightMemoryName(m));
    }
    memory_names += " (--weights)";
  }
  std::printf(
      "model: %lld layers, hidden %lld, SwiGLU %lld, heads %lld/%lld, vocabulary %lld; "
      "weights %s; "
      "%d threads; %d rounds of %d decode tokens; %s clock; load average %s\n",
      static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.intermediate_size), static_cast<long long>(c.num_attention_heads),
      static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.vocab_size),
      memory_names.c_str(), threads, options.rounds, options.tokens,
      options.cpu_time ? "thread CPU" : "wall", LoadAverage().c_str());
  std::vector<Subject> subjects;
  int code = 0;
  for (const std::string& name : options.dtypes) {
    const DType dtype = name == "f16" ? DType::kF16 : name == "bf16" ? DType::kBF16 : DType::kF32;
    const std::string path = dir + "/" + name + ".safetensors";
    absl::StatusOr<ModelConfig> existing = ReadModelConfig(path);
    absl::Status w = keep && existing.ok() && *existing == c ? absl::OkStatus()
                                                             : WriteRandomModel(path, c, 1, dtype);
    if (!w.ok()) {
      std::fprintf(stderr, "bench_engine: %s\n", std::string(w.message()).c_str());
      code = 1;
      break;
    }
    for (WeightMemory memory : memories) {
      Subject s;
      s.dtype = dtype;
      s.label = std::string(DTypeName(dtype));
      if (memories.size() > 1) s.label += StrCat(" ", WeightMemoryName(memory));
      s.path = path;
      const int64_t rss = StatusBytes("VmRSS"), file = StatusBytes("RssFile");
      auto pipeline = Pipeline::Load(s.path, 1, pool, memory);
      if (!pipeline.ok()) {
        std::fprintf(stderr, "bench_engine: %s\n",
                     std::string(pipeline.status().message()).c_str());
        code = 1;
        break;
      }
      s.pipeline = *std::move(pipeline);
      DecodeTokensPerSecond(*s.pipeline, 2, false);  // maps every page a step reads
      s.resident_bytes = StatusBytes("VmRSS") - rss;
      s.file_bytes = StatusBytes("RssFile") - file;
      s.weight_bytes = DecodeWeightBytes(c, s.dtype);
      s.buffer.assign(static_cast<size_t>(s.weight_bytes) / sizeof(uint64_t), 1);
      for (int i = 0; i < s.pipeline->num_stages(); ++i) {
        for (const WeightMatrix& m : s.pipeline->stage(i).StreamedWeights()) {
          s.streamed.emplace_back(static_cast<const char*>(m.data), static_cast<size_t>(m.bytes()));
        }
      }
      subjects.push_back(std::move(s));
    }
    if (code != 0) break;
  }
  for (int round = 0; code == 0 && round < options.rounds; ++round) {
    for (Subject& s : subjects) {  // each weight type in turn, with its own bound
      // The bound and the decode interleaved: before each decode step, two streaming passes
      // over the weights' own pages (the faster is the bound) and one over the buffer, the
      // median of each. This machine's memory bandwidth drifts by a third within seconds (a VM's
      // neighbours): the fastest of five passes before the steps gave single rounds of 0.71 to
      // 1.38 (2026-12-07).
      std::vector<double> own, buffer;
      s.decode_tps.push_back(
          DecodeTokensPerSecond(*s.pipeline, options.tokens, options.cpu_time, [&] {
            own.push_back(
                std::max(StreamRegionsGBps(*pool, s.streamed, /*eight=*/false, options.cpu_time),
                         StreamRegionsGBps(*pool, s.streamed, /*eight=*/true, options.cpu_time)));
            buffer.push_back(StreamReadGBps(*pool, s.buffer, options.cpu_time));
          }));
      s.bound_gbps.push_back(Median(own));
      s.buffer_gbps.push_back(Median(buffer));
      std::printf(
          "  round %d %-4s: bound %6.1f GB/s (a buffer %6.1f), decode %7.1f tok/s = %6.1f GB/s "
          "(%.2f)",
          round + 1, s.label.c_str(), s.bound_gbps.back(), s.buffer_gbps.back(),
          s.decode_tps.back(), s.decode_tps.back() * s.weight_bytes / 1e9,
          s.decode_tps.back() * s.weight_bytes / 1e9 / s.bound_gbps.back());
      if (options.prefill_tokens > 0) {
        s.prefill_s.push_back(
            PrefillSeconds(*s.pipeline, options.prefill_tokens, options.cpu_time));
        std::printf(", prefill %d tokens %.3f s = %.1f tok/s", options.prefill_tokens,
                    s.prefill_s.back(), options.prefill_tokens / s.prefill_s.back());
      }
      std::printf("\n");
    }
  }
  if (code == 0) {
    std::printf("\nload average at the end: %s\n", LoadAverage().c_str());
    std::printf("median (min-max) over %d rounds\n", options.rounds);
    std::printf(
        "| weights | bytes/token | resident (mapped) | bound GB/s | a buffer's GB/s | decode tok/s "
        "| decode GB/s | decode / bound |\n|---|---|---|---|---|---|---|---|\n");
    for (const Subject& s : subjects) {
      std::vector<double> gbps, ratio;
      for (size_t i = 0; i < s.decode_tps.size(); ++i) {
        gbps.push_back(s.decode_tps[i] * s.weight_bytes / 1e9);
        ratio.push_back(gbps.back() / s.bound_gbps[i]);
      }
      std::printf("| %s | %.1f MB | %.0f MB (%.0f MB) | %s | %s | %s | %s | %s |\n",
                  s.label.c_str(), s.weight_bytes / 1e6, s.resident_bytes / 1e6, s.file_bytes / 1e6,
                  Range(s.bound_gbps, "%.1f").c_str(), Range(s.buffer_gbps, "%.1f").c_str(),
                  Range(s.decode_tps, "%.1f").c_str(), Range(gbps, "%.1f").c_str(),
                  Range(ratio, "%.2f").c_str());
    }
    if (options.prefill_tokens > 0) {
      std::printf(
          "\nprefill of %d tokens, one step; \"x one pass\": its time over that of one pass over "
          "the step's weights at the round's bound (1.00 would be memory-bound)\n"
          "| weights | prefill s | prefill tok/s | x one pass |\n|---|---|---|---|\n",
          options.prefill_tokens);
      for (const Subject& s : subjects) {
        std::vector<double> tps, passes;
        for (size_t i = 0; i < s.prefill_s.size(); ++i) {
          tps.push_back(options.prefill_tokens / s.prefill_s[i]);
          passes.push_back(s.prefill_s[i] / (s.weight_bytes / 1e9 / s.bound_gbps[i]));
        }
        std::printf("| %s | %s | %s | %s |\n", s.label.c_str(), Range(s.prefill_s, "%.3f").c_str(),
                    Range(tps, "%.1f").c_str(), Range(passes, "%.1f").c_str());
      }
    }
  }
  if (!keep) {
    for (const std::string& name : options.dtypes)
      ::unlink((dir + "/" + name + ".safetensors").c_str());
    ::rmdir(dir.c_str());
  }
  return code;
}

}  // namespace connex::engine
