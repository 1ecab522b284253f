// Metrics: a small Prometheus registry — counters, gauges and fixed-bucket histograms, each a
// family of series keyed by label values — rendered in the Prometheus text exposition format
// (version 0.0.4: `# HELP`, `# TYPE`, `name{label="value"} number`, histograms as
// `_bucket{le=...}`,
// `_sum`, `_count`). What /metrics of connex-stage and connex-proxy serves.
//
// Thread-safe: families are registered and series looked up, updated and rendered from any thread.
// A family and a series live as long as their registry; the references handed out stay valid, so
// hot paths look a series up once and keep it. Registering a name twice with the same type returns
// the first family; with another type, an invalid name, or a series looked up with the wrong
// number of label values is a bug in the caller and aborts.
#ifndef CONNEX_SERVING_METRICS_H_
#define CONNEX_SERVING_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "connex/base/mutex.h"

namespace connex::serving {

// A value that only goes up (requests served, tokens generated).
class Counter {
 public:
  void Increment(double amount = 1.0);  // amount >= 0
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (requests running).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double amount = 1.0);
  void Decrement(double amount = 1.0) { Increment(-amount); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets (upper bounds, ascending; +Inf is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  mutable Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative
  double sum_ ABSL_GUARDED_BY(mu_) = 0.0;
};

// Bucket bounds for latencies in seconds, 1 ms to 60 s.
std::vector<double> LatencyBuckets();

enum class MetricType { kCounter, kGauge, kHistogram };

// What the registry knows of a family of any type.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }
  // Appends the family's HELP, TYPE and sample lines.
  void Render(std::string* out) const { RenderAs(out, name_, ""); }
  // The same under the name `name`, with `first_labels` (`a="x"`, already escaped) first in
  // every label set: an alias (MetricsRegistry::AddAlias).
  virtual void RenderAs(std::string* out, std::string_view name,
                        std::string_view first_labels) const = 0;

 protected:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names);
  // `{a="x",b="y"}` for `values` (after `first`, and with `extra`, e.g. le="0.5", appended), or
  // "" when all are empty.
  std::string LabelSet(const std::vector<std::string>& values, std::string_view first,
                       std::string_view extra = {}) const;
  void RenderHeader(std::string* out, std::string_view name) const;
  void CheckLabelCount(const std::vector<std::string>& values) const;

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
};

// The series of one metric name, one per combination of label values.
template <typename Series>
class Family final : public FamilyBase {
 public:
  // The series for `label_values` (as many as the family's label names, in that order), created
  // at zero on first use.
  Series& WithLabels(const std::vector<std::string>& label_values);
  // The series of a family without labels.
  Series& Get() { return WithLabels({}); }

  void RenderAs(std::string* out, std::string_view name,
                std::string_view first_labels) const override;

 private:
  friend class MetricsRegistry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds);

  const std::vector<double> bounds_;  // histograms only
  mutable Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Series>> series_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  CounterFamily& AddCounter(std::string_view name, std::string_view help,
                            std::vector<std::string> label_names = {});
  GaugeFamily& AddGauge(std::string_view name, std::string_view help,
                        std::vector<std::string> label_names = {});
  // `bounds`: ascending upper bounds, finite (+Inf is implicit).
  HistogramFamily& AddHistogram(std::string_view name, std::string_view help,
                                std::vector<double> bounds,
                                std::vector<std::string> label_names = {});

  // Renders `source` (a family of this registry) a second time as `name`, with the label
  // `label`="`value`" first in every series: vLLM's metric names (`vllm:...{model_name=...}`) for
  // the dashboards built for vLLM. Registering `name` twice keeps the first.
  void AddAlias(const FamilyBase& source, std::string_view name, std::string_view label,
                std::string_view value);
  // The family registered as `name`, nullptr when none is.
  const FamilyBase* Find(std::string_view name) const;

  // Every family in registration order, in the text exposition format
  // (Content-Type: kPrometheusContentType).
  std::string Render() const;

 private:
  template <typename Series>
  Family<Series>& Add(std::string_view name, std::string_view help,
                      std::vector<std::string> label_names, std::vector<double> bounds);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// The request metrics every OpenAI-compatible front (stage 0's API, the resume proxy) exports,
// registered in `registry` under the same names, so that one dashboard reads either.
struct RequestMetrics {
  explicit RequestMetrics(MetricsRegistry& registry);
  // A request's life, for the two gauges: accepted (running and waiting), its first token
  // (no longer waiting), its end (`got_token`: whether it had one).
  void Accepted();
  void FirstToken();
  void Ended(bool got_token);
  // Registers vLLM's names for these series (vllm:num_requests_running, ..._waiting,
  // vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds,
  // vllm:e2e_request_latency_seconds, vllm:prompt_tokens_total, vllm:generation_tokens_total,
  // vllm:request_success_total), each with model_name="`model`".
  void AddVllmAliases(std::string_view model);

  MetricsRegistry& registry;
  Gauge& running;              // connex_requests_running: accepted, not ended
  Gauge& waiting;              // connex_requests_waiting: accepted, no token yet
  Counter& prompt_tokens;      // connex_prompt_tokens_total
  Counter& generation_tokens;  // connex_generation_tokens_total
  Histogram& ttft;             // connex_time_to_first_token_seconds
  Histogram& itl;              // connex_inter_token_latency_seconds
  Histogram& e2e;              // connex_e2e_request_latency_seconds
  CounterFamily& success;      // connex_request_success_total{finished_reason}
};

// The access line of an OpenAI-compatible front (stage 0's API, the proxy) for a request that
// ended: its status, tokens and latency, and the finish reason (200) or the error as `outcome`;
// `attempts` unless negative (the proxy's upstream attempts). connex/base/access_log.h.
struct RequestAccess {
  std::string_view id;
  std::string_view endpoint;
  int status = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t latency_us = 0;
  std::string_view outcome;
  int attempts = -1;
};
void LogRequestAccess(const RequestAccess& a);

inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

}  // namespace connex::serving

#endif  // CONNEX_SERVING_METRICS_H_
