#include "connex/chaos/reference.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/subprocess.h"
#include "connex/engine/tokenizer.h"
#include "nlohmann/json.hpp"

namespace connex::chaos {

std::string RequestSpec::Body(const std::string& model) const {
  nlohmann::json j = {{"model", model},
                      {"prompt", prompt},
                      {"max_tokens", max_tokens},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}}};
  // Every sampling field, so that the server's defaults (a model's generation_config.json,
  // --generation-config auto) do not apply: the reference runs with --generation-config none.
  j["temperature"] = temperature > 0 ? temperature : 0;
  if (temperature > 0) j["seed"] = seed;
  j["top_p"] = temperature > 0 ? top_p : 1;
  j["top_k"] = -1;
  j["min_p"] = min_p;
  j["repetition_penalty"] = repetition_penalty;
  if (ignore_eos) j["ignore_eos"] = true;
  if (!stop_token_ids.empty()) j["stop_token_ids"] = stop_token_ids;
  return DumpJson(j);
}

bool RequestSpec::Stops(int32_t token) const {
  return (token == engine::kEosToken && !ignore_eos) ||
         std::find(stop_token_ids.begin(), stop_token_ids.end(), token) != stop_token_ids.end();
}

absl::Status References::Compute(const std::vector<RequestSpec>& specs) {
  // One connex-generate per sampling setting over the one-line prompts not known yet (a prompts
  // file, run as one batch); one of its own (--prompt) for a prompt of several lines, as a
  // rendered chat is.
  // Requests of one setting differ by their prompt alone: the key without it.
  auto setting = [](const RequestSpec& s) -> Key {
    RequestSpec any = s;
    any.prompt.clear();
    return any.Key();
  };
  std::map<Key, Run> batches;
  std::vector<Run> runs;
  for (const RequestSpec& s : specs) {
    if (known_.count(s.Key())) continue;
    if (s.prompt.find('\n') != std::string::npos) {
      runs.push_back({s, {s.prompt}});
      continue;
    }
    Run& batch = batches[setting(s)];
    batch.sampling = s;
    if (std::find(batch.prompts.begin(), batch.prompts.end(), s.prompt) == batch.prompts.end()) {
      batch.prompts.push_back(s.prompt);
    }
  }
  for (auto& [key, batch] : batches) runs.push_back(std::move(batch));
  // Workers take the runs in order; each run's result lands in its own slot.
  std::vector<absl::StatusOr<std::vector<Reference>>> results(runs.size());
  std::atomic<size_t> next{0};
  const int first_id = runs_;
  runs_ += static_cast<int>(runs.size());
  auto work = [&] {
    for (size_t i = next++; i < runs.size(); i = next++) {
      results[i] = Generate(runs[i], first_id + static_cast<int>(i));
    }
  };
  const size_t workers =
      std::min<size_t>(runs.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!results[i].ok()) return results[i].status();
    for (size_t p = 0; p < runs[i].prompts.size(); ++p) {
      RequestSpec spec = runs[i].sampling;
      spec.prompt = runs[i].prompts[p];
      known_[spec.Key()] = std::move((*results[i])[p]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Reference>> References::Generate(const Run& run, int id) const {
  const RequestSpec& sampling = run.sampling;
  const std::vector<std::string>& prompts = run.prompts;
  std::vector<std::string> argv = {
      generate_, "--model",  model_path_,     "--max-tokens",        StrCat(sampling.max_tokens),
      "--json",  "--stages", StrCat(stages_), "--generation-config", "none"};
  if (prompts.size() == 1 && prompts[0].find('\n') != std::string::npos) {
    argv.insert(argv.end(), {"--prompt", prompts[0]});
  } else {
    const std::string file = StrCat(work_dir_, "/reference-prompts-", id, ".txt");
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    for (const std::string& p : prompts) out << p << "\n";
    if (!out) return absl::InternalError(StrCat("reference: cannot write ", file));
    argv.insert(argv.end(), {"--prompts-file", file});
  }
  if (sampling.temperature > 0) {
    argv.insert(argv.end(),
                {"--temperature", StrCat(sampling.temperature), "--seed", StrCat(sampling.seed)});
    if (sampling.top_p < 1) argv.insert(argv.end(), {"--top-p", StrCat(sampling.top_p)});
  }
  if (sampling.min_p > 0) argv.insert(argv.end(), {"--min-p", StrCat(sampling.min_p)});
  if (sampling.repetition_penalty != 1) {
    argv.insert(argv.end(), {"--repetition-penalty", StrCat(sampling.repetition_penalty)});
  }
  if (sampling.ignore_eos) argv.push_back("--ignore-eos");
  if (!sampling.stop_token_ids.empty()) {
    std::string ids;
    for (int32_t id : sampling.stop_token_ids) ids += StrCat(ids.empty() ? "" : ",", id);
    argv.insert(argv.end(), {"--stop-token-ids", ids});
  }
  SubprocessOptions options;
  options.env = {"CONNEX_ENGINE_THREADS=1"};
  options.stderr_path = StrCat(work_dir_, "/connex-generate-", id, ".log");
  std::string error;
  std::optional<Subprocess> g = Subprocess::Start(argv, options, &error);
  if (!g) return absl::InternalError("reference: " + error);
  std::vector<Reference> lines;
  while (std::optional<std::string> line = g->ReadLine(600'000)) {
    nlohmann::json j = ParseJson(*line);
    if (j.is_discarded() || !j.contains("tokens") || !j.contains("text") ||
        !j.contains("prompt_tokens") || !j.contains("finish_reason")) {
      return absl::InternalError("reference: connex-generate printed " + line->substr(0, 200));
    }
    lines.push_back({j["tokens"].get<std::vector<int32_t>>(), j["text"].get<std::string>(),
                     j["prompt_tokens"].get<int64_t>(), j["finish_reason"].get<std::string>()});
  }
  std::optional<int> code = g->Wait(60'000);
  if (code != 0 || lines.size() != prompts.size()) {
    return absl::InternalError(StrCat(
        "reference: connex-generate exited ", code ? StrCat(*code) : std::string("(hung)"),
        " with ", lines.size(), " of ", prompts.size(), " lines (see ", options.stderr_path, ")"));
  }
  return lines;
}

const Reference* References::Find(const RequestSpec& spec) const {
  auto it = known_.find(spec.Key());
  return it == known_.end() ? nullptr : &it->second;
}

Comparison CompareTokens(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  Comparison c;
  const size_t n = std::min(got.size(), want.size());
  c.compared = static_cast<int64_t>(std::max(got.size(), want.size()));
  for (size_t i = 0; i < n; ++i) c.mismatched += got[i] != want[i];
  c.mismatched += static_cast<int64_t>(std::max(got.size(), want.size()) - n);
  return c;
}

}  // namespace connex::chaos
