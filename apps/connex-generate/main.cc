// connex-generate: a single-process reference run of the engine. Greedy (or, with --temperature,
// seeded counter-based sampling; with --min-p, --repetition-penalty and --stop-token-ids as the
// API's fields) generation for one prompt (--prompt) or for the lines of a file
// (--prompts-file, one continuous batch), optionally
// as n pipeline stages passing tensor dicts (--stages) and with the KV cache dropped and rebuilt
// after K tokens (--recompute-at): the output must not change. Text goes through the model's
// tokenizer (tokenizer.json in the model's directory, else the byte tokenizer) as stage 0's
// does (serving::ModelText): prompts with its special tokens, and generation ends at the same
// stop tokens (the checkpoint's EOS ids, the tokenizer's and the chat template's end of turn).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "connex/base/cli.h"
#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/engine/generator.h"
#include "connex/engine/pipeline.h"
#include "connex/engine/tokenizer.h"
#include "connex/serving/model_text.h"
#include "nlohmann/json.hpp"

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "connex-generate: " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? connex::kUsageExitCode : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace connex::engine;
  std::string model, prompt, prompts_file, prompt_tokens;
  bool json = false, ignore_eos = false;
  int stages = 1;
  GenerateOptions options;
  absl::StatusOr<int> env_threads = EngineThreadsFromEnv();
  if (!env_threads.ok()) return Fail(env_threads.status());
  int threads = *env_threads;

  connex::pp::Sampling sampling;
  connex::cli::App app{"Generation with the reference engine"};
  app.add_option("--model", model,
                 "checkpoint: a .safetensors file, or a Hugging Face model directory "
                 "(config.json with model.safetensors or shards and their index)")
      ->required();
  auto* prompt_opt = app.add_option("--prompt", prompt, "prompt text");
  auto* file_opt =
      app.add_option("--prompts-file", prompts_file, "one prompt per line, run as one batch");
  auto* ids_opt = app.add_option("--prompt-tokens", prompt_tokens,
                                 "the prompt as token ids (\"128000,9906\"), no tokenizer");
  prompt_opt->excludes(file_opt);
  ids_opt->excludes(prompt_opt)->excludes(file_opt);
  app.add_option("--max-tokens", options.max_tokens, "tokens to generate per prompt")
      ->check(connex::cli::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_flag("--json", json, R"(print {"tokens":[...],"text":"..."}, one line per prompt)");
  app.add_option("--recompute-at", options.recompute_at,
                 "after K generated tokens drop the KV cache and re-prefill (0: never)")
      ->check(connex::cli::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--stages", stages, "run the model as n pipeline stages")
      ->check(connex::cli::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--threads", threads, "kernel threads")
      ->envname("CONNEX_ENGINE_THREADS")
      ->check(connex::cli::Range(1, 256))
      ->capture_default_str();
  app.add_option("--max-batch", options.max_batch,
                 "at most this many requests per step, the others wait (0: no limit)")
      ->check(connex::cli::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--prefill-chunk", options.prefill_chunk,
                 "at most this many prompt tokens of a request per step (0: whole prompt)")
      ->check(connex::cli::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--ignore-eos", ignore_eos, "keep generating after an EOS token");
  auto* temperature_opt =
      app.add_option("--temperature", sampling.temperature,
                     "0: greedy; > 0: sample, the draw of each token keyed by (seed, position)")
          ->check(connex::cli::Range(0.0f, 2.0f))
          ->capture_default_str();
  auto* top_p_opt = app.add_option("--top-p", sampling.top_p,
                                   "nucleus sampling: keep the most probable tokens "
                                   "whose mass reaches this (0, 1]")
                        ->check(connex::cli::Range(0.0f, 1.0f))
                        ->capture_default_str();
  auto* top_k_opt =
      app.add_option("--top-k", sampling.top_k, "sample among the k most probable tokens (0: all)")
          ->check(connex::cli::NonNegativeNumber)
          ->capture_default_str();
  app.add_option("--seed", sampling.seed, "the sampling seed of every prompt")
      ->capture_default_str();
  auto* min_p_opt =
      app.add_option("--min-p", sampling.min_p,
                     "drop the tokens less probable than this times the most probable [0, 1]")
          ->check(connex::cli::Range(0.0f, 1.0f))
          ->capture_default_str();
  auto* penalty_opt =
      app.add_option("--repetition-penalty", sampling.repetition_penalty,
                     "> 0, 1: none; the logits of the prompt's and output's tokens are divided "
                     "(positive) or multiplied by it, greedy or sampled")
          ->capture_default_str();
  app.add_option("--stop-token-ids", options.stop_token_ids,
                 "token ids that end a generation (\"10,33\"), kept in the tokens, left out of "
                 "the text")
      ->delimiter(',');
  std::string generation_config = "auto";
  app.add_option("--generation-config", generation_config,
                 "auto: a sampling flag not given takes the model's generation_config.json "
                 "value, as connex-stage's API does; none: the built-in defaults (greedy)")
      ->check(connex::cli::IsMember({"auto", "none"}))
      ->capture_default_str();
  connex::AddLogLevelFlag(app);
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv, [&] {
        if (prompt_opt->count() == 0 && file_opt->count() == 0 && ids_opt->count() == 0) {
          throw connex::cli::RequiredError("--prompt or --prompts-file");
        }
      })) {
    return *code;
  }
  options.stop_at_eos = !ignore_eos;
  if (absl::Status ok = sampling.Validate(); !ok.ok()) return Fail(ok);

  absl::StatusOr<std::unique_ptr<Pipeline>> pipeline =
      Pipeline::Load(model, stages, std::make_shared<ThreadPool>(threads));
  if (!pipeline.ok()) return Fail(pipeline.status());
  if (generation_config == "auto") {
    // What the API gives a request without these fields (serving::SamplingDefaultsOf).
    const GenerationDefaults& g = (*pipeline)->config().generation;
    auto fill = [](connex::cli::Option* given, const auto& value, auto& out) {
      if (given->count() == 0 && value) out = static_cast<std::decay_t<decltype(out)>>(*value);
    };
    fill(temperature_opt, g.temperature, sampling.temperature);
    fill(top_p_opt, g.top_p, sampling.top_p);
    if (top_k_opt->count() == 0 && g.top_k) {
      sampling.top_k = *g.top_k > 0 ? static_cast<int32_t>(*g.top_k) : 0;
    }
    fill(min_p_opt, g.min_p, sampling.min_p);
    fill(penalty_opt, g.repetition_penalty, sampling.repetition_penalty);
    if (absl::Status ok = sampling.Validate(); !ok.ok()) {
      return Fail(connex::Annotate(ok, "generation_config.json"));
    }
  }
  // The model's text side. --prompt-tokens needs no tokenizer: without one that loads, the run
  // prints no text and stops at the checkpoint's EOS ids alone (the engine's own stop).
  const ModelConfig& config = (*pipeline)->config();
  std::unique_ptr<const connex::serving::ModelText> text;
  if (absl::StatusOr<std::unique_ptr<const connex::serving::ModelText>> loaded =
          connex::serving::ModelText::Load(model, config.eos_token_ids);
      loaded.ok()) {
    text = *std::move(loaded);
  } else if (ids_opt->count() == 0) {
    return Fail(loaded.status());
  }
  auto encode = [&](const std::string& line) -> absl::StatusOr<std::vector<int32_t>> {
    return text->CompletionPrompt(line);
  };
  auto stops = [&](int32_t t) { return text ? text->Stops(t) : config.IsEos(t); };
  std::vector<std::vector<int32_t>> prompts;
  if (file_opt->count() > 0) {
    // A directory opens as a stream that reads nothing: it would run no prompt and exit 0.
    if (std::error_code ec; std::filesystem::is_directory(prompts_file, ec)) {
      return Fail(absl::InvalidArgumentError("--prompts-file " + prompts_file +
                                             ": is a directory, not a file of prompts"));
    }
    std::ifstream in(prompts_file, std::ios::binary);
    if (!in) return Fail(absl::NotFoundError(prompts_file + ": cannot open the prompts file"));
    std::string line;
    while (std::getline(in, line)) {
      absl::StatusOr<std::vector<int32_t>> ids = encode(line);
      if (!ids.ok()) return Fail(ids.status());
      prompts.push_back(*std::move(ids));
    }
    if (in.bad()) return Fail(absl::DataLossError(prompts_file + ": reading the prompts failed"));
  } else if (ids_opt->count() > 0) {
    std::vector<int32_t> ids;
    for (absl::string_view item : absl::StrSplit(prompt_tokens, ',')) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(item, &id)) {
        return Fail(absl::InvalidArgumentError("--prompt-tokens: \"" + std::string(item) +
                                               "\" is not a token id"));
      }
      ids.push_back(id);
    }
    prompts.push_back(std::move(ids));
  } else {
    absl::StatusOr<std::vector<int32_t>> ids = encode(prompt);
    if (!ids.ok()) return Fail(ids.status());
    prompts.push_back(*std::move(ids));
  }

  if (!sampling.argmax()) options.sampling.assign(prompts.size(), sampling);
  // The engine stops at the checkpoint's EOS ids; the model's other stop tokens (the tokenizer's
  // EOS, the chat template's end of turn) end a generation the same way, as they end a served
  // request, unless --ignore-eos. --stop-token-ids adds the caller's.
  const std::vector<int32_t> caller_stops = options.stop_token_ids;
  if (!ignore_eos && text) {
    options.stop_token_ids.insert(options.stop_token_ids.end(), text->stop_tokens().begin(),
                                  text->stop_tokens().end());
  }
  absl::StatusOr<std::vector<Generation>> results = Generate(**pipeline, prompts, options);
  if (!results.ok()) return Fail(results.status());
  for (size_t i = 0; i < results->size(); ++i) {
    const std::vector<int32_t>& tokens = (*results)[i].tokens;
    // The token that ended the generation is in `tokens`, not in the text (vLLM's rule).
    const bool stopped = !tokens.empty() && ((!ignore_eos && stops(tokens.back())) ||
                                             std::find(caller_stops.begin(), caller_stops.end(),
                                                       tokens.back()) != caller_stops.end());
    std::span<const int32_t> shown = tokens;
    if (stopped) shown = shown.first(shown.size() - 1);
    // The text as stage 0 streams it; the byte tokenizer's plain output keeps the exact bytes.
    std::string out;
    if (text && text->byte_level() && !json) {
      out = Detokenize(shown);
    } else if (text) {
      out = text->GeneratedText(prompts[i], shown, ignore_eos);
    }
    if (json) {
      nlohmann::ordered_json line = {{"tokens", tokens},
                                     {"text", out},
                                     {"prompt_tokens", prompts[i].size()},
                                     {"finish_reason", stopped ? "stop" : "length"}};
      // Invalid UTF-8 (a random model emits any byte) is replaced in "text"; "tokens" is exact.
      std::cout << connex::DumpJson(line) << "\n";
    } else {
      std::cout << out << "\n";
    }
  }
  std::cout.flush();
  return std::cout ? 0 : 1;
}
