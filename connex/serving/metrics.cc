#include "connex/serving/metrics.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "connex/base/access_log.h"
#include "connex/base/logging.h"
#include "connex/base/strings.h"

namespace connex::serving {
namespace {

// A misuse of the registry by our own code: log it and abort.
void CheckOrDie(bool condition, std::string_view what) {
  if (condition) return;
  CONNEX_LOG_FATAL("metrics: {}", what);
}

bool ValidName(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

void AppendEscaped(std::string* out, std::string_view text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (quote && c == '"') {
      *out += "\\\"";
    } else {
      *out += c;
    }
  }
}

void AtomicAdd(std::atomic<double>* value, double amount) {
  double current = value->load(std::memory_order_relaxed);
  while (!value->compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
  }
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

template <typename Series>
constexpr MetricType TypeOf();
template <>
constexpr MetricType TypeOf<Counter>() {
  return MetricType::kCounter;
}
template <>
constexpr MetricType TypeOf<Gauge>() {
  return MetricType::kGauge;
}
template <>
constexpr MetricType TypeOf<Histogram>() {
  return MetricType::kHistogram;
}

template <typename Series>
std::unique_ptr<Series> NewSeries(const std::vector<double>& bounds) {
  if constexpr (std::is_same_v<Series, Histogram>) {
    return std::make_unique<Histogram>(bounds);
  } else {
    return std::make_unique<Series>();
  }
}

}  // namespace

void Counter::Increment(double amount) {
  CheckOrDie(amount >= 0.0, "a counter may only go up");
  AtomicAdd(&value_, amount);
}

void Gauge::Increment(double amount) { AtomicAdd(&value_, amount); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  // The first bucket whose upper bound holds the value ("le" is inclusive); +Inf otherwise.
  size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snap;
  MutexLock lock(&mu_);
  snap.cumulative.reserve(counts_.size());
  for (uint64_t count : counts_) {
    snap.count += count;
    snap.cumulative.push_back(snap.count);
  }
  snap.sum = sum_;
  return snap;
}

RequestMetrics::RequestMetrics(MetricsRegistry& registry)
    : registry(registry),
      running(registry.AddGauge("connex_requests_running", "Requests being answered").Get()),
      waiting(registry
                  .AddGauge("connex_requests_waiting",
                            "Requests accepted that have no token yet (queued or in prefill)")
                  .Get()),
      prompt_tokens(
          registry.AddCounter("connex_prompt_tokens_total", "Prompt tokens of accepted requests")
              .Get()),
      generation_tokens(
          registry.AddCounter("connex_generation_tokens_total", "Tokens generated").Get()),
      ttft(registry
               .AddHistogram("connex_time_to_first_token_seconds",
                             "From a request's arrival to its first token", LatencyBuckets())
               .Get()),
      itl(registry
              .AddHistogram("connex_inter_token_latency_seconds",
                            "Between two tokens of one request", LatencyBuckets())
              .Get()),
      e2e(registry
              .AddHistogram("connex_e2e_request_latency_seconds",
                            "From a request's arrival to its end", LatencyBuckets())
              .Get()),
      success(registry.AddCounter("connex_request_success_total",
                                  "Requests that completed, by finish reason",
                                  {"finished_reason"})) {}

void RequestMetrics::Accepted() {
  running.Increment();
  waiting.Increment();
}

void RequestMetrics::FirstToken() { waiting.Decrement(); }

void RequestMetrics::Ended(bool got_token) {
  running.Decrement();
  if (!got_token) waiting.Decrement();
}

void RequestMetrics::AddVllmAliases(std::string_view model) {
  const std::pair<std::string_view, std::string_view> aliases[] = {
      {"connex_requests_running", "vllm:num_requests_running"},
      {"connex_requests_waiting", "vllm:num_requests_waiting"},
      {"connex_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"},
      {"connex_inter_token_latency_seconds", "vllm:time_per_output_token_seconds"},
      {"connex_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"},
      {"connex_prompt_tokens_total", "vllm:prompt_tokens_total"},
      {"connex_generation_tokens_total", "vllm:generation_tokens_total"},
      {"connex_request_success_total", "vllm:request_success_total"},
  };
  for (const auto& [source, alias] : aliases) {
    const FamilyBase* family = registry.Find(source);
    CheckOrDie(family != nullptr, StrCat("no metric '", source, "' to alias"));
    registry.AddAlias(*family, alias, "model_name", model);
  }
}

void LogRequestAccess(const RequestAccess& a) {
  const std::string_view outcome_key = a.status == 200 ? "finish_reason" : "error";
  const double latency_s = static_cast<double>(a.latency_us) / 1e6;
  std::vector<LogField> fields = {{"id", a.id},
                                  {"endpoint", a.endpoint},
                                  {"status", a.status},
                                  {"prompt_tokens", a.prompt_tokens},
                                  {"completion_tokens", a.completion_tokens},
                                  {"latency_s", latency_s}};
  if (a.attempts >= 0) fields.emplace_back("attempts", a.attempts);  // the proxy's
  fields.emplace_back(outcome_key, a.outcome);
  LogAccess(fields);
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {
  CheckOrDie(ValidName(name_, /*allow_colon=*/true), StrCat("invalid metric name '", name_, "'"));
  for (const std::string& label : label_names_) {
    CheckOrDie(ValidName(label, /*allow_colon=*/false) && label.rfind("__", 0) != 0 &&
                   !(type_ == MetricType::kHistogram && label == "le"),
               StrCat("invalid label name '", label, "' of metric '", name_, "'"));
  }
}

void FamilyBase::CheckLabelCount(const std::vector<std::string>& values) const {
  CheckOrDie(values.size() == label_names_.size(),
             StrCat("metric '", name_, "' has ", label_names_.size(), " labels, got ",
                    values.size(), " values"));
}

std::string FamilyBase::LabelSet(const std::vector<std::string>& values, std::string_view first,
                                 std::string_view extra) const {
  if (values.empty() && extra.empty() && first.empty()) return "";
  std::string out = "{";
  out += first;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0 || !first.empty()) out += ',';
    out += label_names_[i];
    out += "=\"";
    AppendEscaped(&out, values[i], /*quote=*/true);
    out += '"';
  }
  if (!extra.empty()) {
    if (!values.empty() || !first.empty()) out += ',';
    out += extra;
  }
  out += '}';
  return out;
}

void FamilyBase::RenderHeader(std::string* out, std::string_view name) const {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  AppendEscaped(out, help_, /*quote=*/false);
  *out += StrCat("\n# TYPE ", name, " ", TypeName(type_), "\n");
}

template <typename Series>
Family<Series>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                       std::vector<double> bounds)
    : FamilyBase(std::move(name), std::move(help), TypeOf<Series>(), std::move(label_names)),
      bounds_(std::move(bounds)) {
  CheckOrDie(
      std::is_sorted(bounds_.begin(), bounds_.end()) &&
          std::adjacent_find(bounds_.begin(), bounds_.end()) == bounds_.end() &&
          std::all_of(bounds_.begin(), bounds_.end(), [](double b) { return std::isfinite(b); }),
      StrCat("histogram '", name_, "' needs finite, strictly ascending bounds"));
  // A family without labels has its one series from the start, so it renders as 0.
  MutexLock lock(&mu_);
  if (label_names_.empty()) series_.emplace(std::vector<std::string>{}, NewSeries<Series>(bounds_));
}

template <typename Series>
Series& Family<Series>::WithLabels(const std::vector<std::string>& label_values) {
  CheckLabelCount(label_values);
  MutexLock lock(&mu_);
  std::unique_ptr<Series>& series = series_[label_values];
  if (series == nullptr) series = NewSeries<Series>(bounds_);
  return *series;
}

template <typename Series>
void Family<Series>::RenderAs(std::string* out, std::string_view name,
                              std::string_view first) const {
  RenderHeader(out, name);
  MutexLock lock(&mu_);
  for (const auto& [values, series] : series_) {
    if constexpr (std::is_same_v<Series, Histogram>) {
      Histogram::Snapshot snap = series->snapshot();
      for (size_t i = 0; i < snap.cumulative.size(); ++i) {
        std::string le =
            StrCat("le=\"", i < bounds_.size() ? FormatValue(bounds_[i]) : "+Inf", "\"");
        *out += StrCat(name, "_bucket", LabelSet(values, first, le), " ", snap.cumulative[i], "\n");
      }
      *out += StrCat(name, "_sum", LabelSet(values, first), " ", FormatValue(snap.sum), "\n");
      *out += StrCat(name, "_count", LabelSet(values, first), " ", snap.count, "\n");
    } else {
      *out += StrCat(name, LabelSet(values, first), " ", FormatValue(series->value()), "\n");
    }
  }
}

namespace {

// A second name for a family (MetricsRegistry::AddAlias): renders the source's series.
class AliasFamily final : public FamilyBase {
 public:
  AliasFamily(const FamilyBase& source, std::string name, std::string first_labels)
      : FamilyBase(std::move(name), "", source.type(), {}),
        source_(source),
        first_labels_(std::move(first_labels)) {}
  void RenderAs(std::string* out, std::string_view name, std::string_view) const override {
    source_.RenderAs(out, name, first_labels_);
  }

 private:
  const FamilyBase& source_;
  const std::string first_labels_;
};

}  // namespace

const FamilyBase* MetricsRegistry::Find(std::string_view name) const {
  MutexLock lock(&mu_);
  for (const std::unique_ptr<FamilyBase>& family : families_) {
    if (family->name() == name) return family.get();
  }
  return nullptr;
}

void MetricsRegistry::AddAlias(const FamilyBase& source, std::string_view name,
                               std::string_view label, std::string_view value) {
  CheckOrDie(ValidName(label, /*allow_colon=*/false), StrCat("invalid label name '", label, "'"));
  std::string first = StrCat(label, "=\"");
  AppendEscaped(&first, value, /*quote=*/true);
  first += '"';
  MutexLock lock(&mu_);
  for (const std::unique_ptr<FamilyBase>& family : families_) {
    if (family->name() == name) return;
  }
  families_.push_back(std::make_unique<AliasFamily>(source, std::string(name), std::move(first)));
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

template <typename Series>
Family<Series>& MetricsRegistry::Add(std::string_view name, std::string_view help,
                                     std::vector<std::string> label_names,
                                     std::vector<double> bounds) {
  MutexLock lock(&mu_);
  for (const std::unique_ptr<FamilyBase>& family : families_) {
    if (family->name() != name) continue;
    CheckOrDie(family->type() == TypeOf<Series>(),
               StrCat("metric '", name, "' registered twice with different types"));
    return static_cast<Family<Series>&>(*family);
  }
  auto* family = new Family<Series>(std::string(name), std::string(help), std::move(label_names),
                                    std::move(bounds));
  families_.emplace_back(family);
  return *family;
}

CounterFamily& MetricsRegistry::AddCounter(std::string_view name, std::string_view help,
                                           std::vector<std::string> label_names) {
  return Add<Counter>(name, help, std::move(label_names), {});
}

GaugeFamily& MetricsRegistry::AddGauge(std::string_view name, std::string_view help,
                                       std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, std::move(label_names), {});
}

HistogramFamily& MetricsRegistry::AddHistogram(std::string_view name, std::string_view help,
                                               std::vector<double> bounds,
                                               std::vector<std::string> label_names) {
  return Add<Histogram>(name, help, std::move(label_names), std::move(bounds));
}

std::string MetricsRegistry::Render() const {
  std::string out;
  MutexLock lock(&mu_);
  for (const std::unique_ptr<FamilyBase>& family : families_) family->Render(&out);
  return out;
}

}  // namespace connex::serving
