// A request's state as data (StageEngine::ExportState / ImportState / DropState): a pipeline that
// imports another's exported state of a request continues it with bitwise the tokens and logits
// of the undisturbed exporter — greedy or sampled, with a repetition penalty (whose history goes
// along), imported in chunks, alone or batched with other requests; a cut-back state re-runs to
// the same bits; malformed or misplaced imports are refused by name and change nothing.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "connex/base/strings.h"
#include "connex/engine/pipeline.h"
#include "connex/engine/random_model.h"
#include "connex/engine/stage_engine.h"
#include "connex/engine/tokenizer.h"
#include "connex/pp/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::engine {
namespace {

using ::testing::HasSubstr;

ModelConfig SmallConfig() {
  ModelConfig c;
  c.hidden_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // kv_dim 24
  c.intermediate_size = 64;
  c.max_position_embeddings = 128;
  return c;
}

// A request as its owner sees it: every token so far (prompt + generated), of which `fed` have
// gone through the pipeline.
struct Request {
  uint64_t id = 0;
  std::vector<int32_t> tokens;
  int64_t fed = 0;
  Sampling sampling;
};

// What a step gave one request: its next token and the bits of its logits.
struct Output {
  int32_t token = 0;
  std::vector<float> logits;
  bool operator==(const Output& o) const {
    return token == o.token && logits.size() == o.logits.size() &&
           std::memcmp(logits.data(), o.logits.data(), logits.size() * sizeof(float)) == 0;
  }
};

class StateExportTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(testing::TempDir() + "/state-export-test." +
                            std::to_string(::getpid()) + ".safetensors");
    ASSERT_TRUE(WriteRandomModel(*path_, SmallConfig(), 7, DType::kF32).ok());
  }
  static void TearDownTestSuite() {
    ::unlink(path_->c_str());
    delete path_;
  }

  static std::unique_ptr<Pipeline> Load(int stages) {
    auto p = Pipeline::Load(*path_, stages, std::make_shared<ThreadPool>(2));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  // One step of `requests` (each feeds its unfed tokens); appends each one's next token.
  static std::vector<Output> Advance(Pipeline& p, std::vector<Request*> requests) {
    std::vector<uint64_t> ids;
    std::vector<int32_t> starts, counts, tokens;
    std::vector<Sampling> sampling;
    for (Request* r : requests) {
      ids.push_back(r->id);
      starts.push_back(static_cast<int32_t>(r->fed));
      counts.push_back(static_cast<int32_t>(r->tokens.size() - r->fed));
      tokens.insert(tokens.end(), r->tokens.begin() + r->fed, r->tokens.end());
      sampling.push_back(r->sampling);
    }
    TensorDict step;
    pp::SetBatch(step, ids, starts, counts);
    step.Set(kTokens, Tensor::Of<int32_t>({static_cast<int64_t>(tokens.size())}, tokens));
    pp::AddSamplingKeys(step, sampling);
    absl::StatusOr<TensorDict> out = p.Step(step);
    EXPECT_TRUE(out.ok()) << out.status();
    std::vector<Output> outputs;
    if (!out.ok()) return outputs;
    const int64_t v = p.config().vocab_size;
    std::span<const float> logits = out->Find(kLogits)->values<float>();
    for (size_t i = 0; i < requests.size(); ++i) {
      Output o;
      o.token = out->Find(kNextTokens)->values<int32_t>()[i];
      o.logits.assign(logits.begin() + i * v, logits.begin() + (i + 1) * v);
      requests[i]->fed = static_cast<int64_t>(requests[i]->tokens.size());
      requests[i]->tokens.push_back(o.token);
      outputs.push_back(std::move(o));
    }
    return outputs;
  }

  // Request `id` after a prefill of `prompt` and `decodes` decode steps on `p`.
  static Request Run(Pipeline& p, uint64_t id, const std::string& prompt, Sampling sampling,
                     int decodes) {
    Request r{.id = id, .tokens = Tokenize(prompt, /*add_bos=*/true), .sampling = sampling};
    for (int i = 0; i <= decodes; ++i) Advance(p, {&r});
    return r;
  }

  // Copies request `from_id`'s state on every stage of `a` to request `to_id` of `b`, in chunks
  // that start at each of `cuts` (0 first).
  static void Copy(Pipeline& a, uint64_t from_id, Pipeline& b, uint64_t to_id,
                   std::vector<int64_t> cuts) {
    for (int s = 0; s < a.num_stages(); ++s) {
      const int64_t n = a.stage(s).HeldPositions(from_id);
      ASSERT_GT(n, cuts.back());
      cuts.push_back(n);
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        auto state = a.stage(s).ExportState(from_id, cuts[c], cuts[c + 1]);
        ASSERT_TRUE(state.ok()) << state.status();
        absl::Status imported = b.stage(s).ImportState(to_id, cuts[c], *state);
        ASSERT_TRUE(imported.ok()) << imported;
      }
      cuts.pop_back();
      EXPECT_EQ(b.stage(s).HeldPositions(to_id), n);
    }
  }

  static Sampling Greedy(float penalty) {
    Sampling s;
    s.repetition_penalty = penalty;
    return s;
  }
  static Sampling Sampled(float penalty, uint64_t seed) {
    Sampling s;
    s.temperature = 0.9f;
    s.top_p = 0.95f;
    s.seed = seed;
    s.repetition_penalty = penalty;
    return s;
  }

  static std::string* path_;
};

std::string* StateExportTest::path_ = nullptr;

TEST_F(StateExportTest, ImportedStateContinuesWithTheExportersBits) {
  for (int stages : {2, 3}) {
    for (const Sampling& sampling : {Greedy(1), Greedy(1.3f), Sampled(1.2f, 99), Sampled(1, 5)}) {
      SCOPED_TRACE(testing::Message() << stages << " stages, temperature " << sampling.temperature
                                      << ", penalty " << sampling.repetition_penalty);
      auto a = Load(stages);
      auto b = Load(stages);
      Request ra = Run(*a, 5, "state as data", sampling, 4);
      EXPECT_TRUE(a->stage(0).ExportsState());
      // The last stage's export carries the penalty's history exactly when it keeps one.
      const int64_t n = ra.fed;
      auto last = a->stage(stages - 1).ExportState(5, 0, n);
      ASSERT_TRUE(last.ok()) << last.status();
      const Tensor* history = last->Find(kStateHistory);
      EXPECT_EQ(history != nullptr, sampling.penalized());
      if (history != nullptr) {
        EXPECT_EQ(std::vector<int32_t>(history->values<int32_t>().begin(),
                                       history->values<int32_t>().end()),
                  std::vector<int32_t>(ra.tokens.begin(), ra.tokens.begin() + n));
      }
      EXPECT_EQ(last->Find("kv.0.k")->shape, (std::vector<int64_t>{n, 24}));
      EXPECT_EQ(a->stage(0).ExportState(5, 0, n)->Find(kStateHistory), nullptr);

      Copy(*a, 5, *b, 8, {0, 3, n - 1});  // three chunks; the standby's id is its own
      Request rb = ra;
      rb.id = 8;
      for (int step = 0; step < 6; ++step) {
        std::vector<Output> oa = Advance(*a, {&ra});
        std::vector<Output> ob = Advance(*b, {&rb});
        ASSERT_EQ(oa.size(), 1u);
        ASSERT_EQ(ob.size(), 1u);
        EXPECT_TRUE(oa[0] == ob[0]) << "step " << step << " after the import: token " << oa[0].token
                                    << " vs " << ob[0].token;
      }
      EXPECT_EQ(ra.tokens, rb.tokens);
    }
  }
}

TEST_F(StateExportTest, ACutBackStateRerunsToTheSameBits) {
  for (const Sampling& sampling : {Greedy(1.3f), Sampled(1.2f, 3)}) {
    auto a = Load(3);
    Request r = Run(*a, 5, "cut back", sampling, 3);
    const int64_t n = r.fed;
    std::vector<TensorDict> before;
    for (int s = 0; s < 3; ++s) before.push_back(*a->stage(s).ExportState(5, 0, n));
    // Three more steps, remembered; then back to n and the same three again.
    Request original = r;
    std::vector<Output> first;
    for (int i = 0; i < 3; ++i) first.push_back(Advance(*a, {&r})[0]);
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(a->stage(s).DropState(5, n).ok());
      EXPECT_EQ(a->stage(s).HeldPositions(5), n);
      EXPECT_EQ(*a->stage(s).ExportState(5, 0, n), before[s]) << "stage " << s;
    }
    r = original;
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(Advance(*a, {&r})[0] == first[i]) << "step " << i;
    // Cut back further, and re-run the cut positions as one chunk: the last token's bits again.
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(a->stage(s).DropState(5, n - 2).ok());
    Request rerun = original;
    rerun.fed = n - 2;
    rerun.tokens.resize(n);
    Output again = Advance(*a, {&rerun})[0];
    EXPECT_EQ(again.token, original.tokens[n]);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(*a->stage(s).ExportState(5, 0, n), before[s]);
    // No-ops: cutting back to more than is held, or a request not held.
    EXPECT_TRUE(a->stage(1).DropState(5, 1000).ok());
    EXPECT_TRUE(a->stage(1).DropState(77, 3).ok());
    EXPECT_EQ(a->stage(1).HeldPositions(5), n);
    EXPECT_EQ(a->stage(1).DropState(5, -1).code(), absl::StatusCode::kInvalidArgument);
    // DropState 0 is Release.
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(a->stage(s).DropState(5, 0).ok());
    EXPECT_EQ(a->stage(2).NumHeldRequests(), 0u);
    EXPECT_FALSE(a->stage(2).HoldsRequest(5));
  }
}

TEST_F(StateExportTest, BadExportsAndImportsAreRefusedByNameAndChangeNothing) {
  auto a = Load(2);
  auto b = Load(2);
  Request r = Run(*a, 5, "errors", Greedy(1.3f), 2);
  const int64_t n = r.fed;
  StageEngine& first = a->stage(0);
  StageEngine& last = a->stage(1);
  EXPECT_EQ(first.HeldPositions(99), 0);
  EXPECT_EQ(first.ExportState(5, 0, n + 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(first.ExportState(5, 0, n + 1).status().message(),
              HasSubstr(StrCat("[0, ", n + 1, ") but ", n, " are held")));
  EXPECT_EQ(first.ExportState(99, 0, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(first.ExportState(5, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(first.ExportState(5, -1, 2).status().code(), absl::StatusCode::kInvalidArgument);

  TensorDict head = *first.ExportState(5, 0, 3);
  TensorDict tail = *first.ExportState(5, 3, n);
  TensorDict last_head = *last.ExportState(5, 0, 3);
  StageEngine& to = b->stage(0);
  StageEngine& to_last = b->stage(1);
  auto refused = [&](StageEngine& e, int64_t from, const TensorDict& state, absl::StatusCode code,
                     const std::string& message) {
    const int64_t held = e.HeldPositions(8);
    absl::StatusOr<TensorDict> before;
    if (held > 0) before = e.ExportState(8, 0, held);
    absl::Status s = e.ImportState(8, from, state);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
    EXPECT_EQ(e.HeldPositions(8), held);
    if (held > 0) {
      EXPECT_EQ(*e.ExportState(8, 0, held), *before);
    }
  };
  // Misplaced: a tail into nothing, a tail at the wrong position.
  refused(to, 3, tail, absl::StatusCode::kFailedPrecondition, "starts at position 3 but 0");
  EXPECT_FALSE(to.HoldsRequest(8));
  ASSERT_TRUE(to.ImportState(8, 0, head).ok());
  refused(to, 4, tail, absl::StatusCode::kFailedPrecondition, "starts at position 4 but 3");
  refused(to, -1, tail, absl::StatusCode::kInvalidArgument, "position -1");
  // Malformed: shape, dtype, a missing key, an unknown layer, rows that disagree.
  TensorDict bad = tail;
  bad.Set("kv.0.k", Tensor::Zeros<float>({n - 3, 23}));
  refused(to, 3, bad, absl::StatusCode::kInvalidArgument, "23], expected [rows >= 1, 24] (kv_dim)");
  bad = tail;
  bad.Set("kv.0.v", Tensor::Zeros<float>({n - 4, 24}));
  refused(to, 3, bad, absl::StatusCode::kInvalidArgument, "'kv.0.v' has shape");
  bad = tail;
  bad.Set("kv.0.k", Tensor::Zeros<int32_t>({n - 3, 24}));
  refused(to, 3, bad, absl::StatusCode::kInvalidArgument, "kv.0.k");
  bad = tail;
  bad.Erase("kv.0.v");
  refused(to, 3, bad, absl::StatusCode::kInvalidArgument, "'kv.0.v' is missing");
  bad = tail;
  bad.Set("kv.9.k", Tensor::Zeros<float>({n - 3, 24}));
  refused(to, 3, bad, absl::StatusCode::kInvalidArgument, "unknown key 'kv.9.k'");
  bad = tail;
  bad.Set(kStateHistory, Tensor::Zeros<int32_t>({n - 3}));
  refused(to, 3, bad, absl::StatusCode::kInvalidArgument, "unknown key 'history'");
  bad = head;
  bad.Set("kv.0.k", Tensor::Zeros<float>({0, 24}));
  bad.Set("kv.0.v", Tensor::Zeros<float>({0, 24}));
  refused(to, 0, bad, absl::StatusCode::kInvalidArgument, "'kv.0.k' has shape [0, 24]");
  refused(to, 125, tail, absl::StatusCode::kInvalidArgument, "pass the model's 128");
  // The last stage: a history of the wrong length or type, or at another position than held.
  bad = last_head;
  bad.Set(kStateHistory, Tensor::Zeros<int32_t>({2}));
  refused(to_last, 0, bad, absl::StatusCode::kInvalidArgument, "'history' has shape [2]");
  bad.Set(kStateHistory, Tensor::Zeros<float>({3}));
  refused(to_last, 0, bad, absl::StatusCode::kInvalidArgument, "history");
  TensorDict no_history = last_head;
  no_history.Erase(kStateHistory);
  ASSERT_TRUE(to_last.ImportState(8, 0, no_history).ok());
  refused(to_last, 3, *last.ExportState(5, 3, n), absl::StatusCode::kFailedPrecondition,
          "0 tokens of its history are held");
  // A wrong import changed nothing: the right one still continues with the exporter's bits.
  ASSERT_TRUE(to.ImportState(8, 3, tail).ok());
  ASSERT_TRUE(to_last.ImportState(8, 0, last_head).ok());  // from 0 starts afresh
  ASSERT_TRUE(to_last.ImportState(8, 3, *last.ExportState(5, 3, n)).ok());
  Request rb = r;
  rb.id = 8;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Advance(*a, {&r})[0] == Advance(*b, {&rb})[0]);
}

TEST_F(StateExportTest, AnImportedRequestIsBatchInvariant) {
  auto a = Load(3);
  auto b = Load(3);
  Request ra = Run(*a, 5, "batched after the import", Sampled(1.2f, 11), 3);
  // The standby serves requests of its own before the import, and beside it after.
  Request other = Run(*b, 1, "another request", Greedy(1.1f), 2);
  Copy(*a, 5, *b, 6, {0, 4});
  Request rb = ra;
  rb.id = 6;
  Request joining{.id = 2, .tokens = Tokenize("one that joins", true), .sampling = Sampled(1, 4)};
  Request joining_alone = joining;
  auto c = Load(3);
  for (int step = 0; step < 5; ++step) {
    Output alone = Advance(*a, {&ra})[0];
    std::vector<Request*> batch = {&other, &rb};
    if (step >= 1) batch.insert(batch.begin() + 1, &joining);
    std::vector<Output> out = Advance(*b, batch);
    ASSERT_EQ(out.size(), batch.size());
    EXPECT_TRUE(out.back() == alone) << "step " << step;
    if (step >= 1) {
      EXPECT_TRUE(out[1] == Advance(*c, {&joining_alone})[0]) << "step " << step;
    }
  }
  EXPECT_EQ(ra.tokens, rb.tokens);
  EXPECT_EQ(b->stage(2).NumHeldRequests(), 3u);
}

}  // namespace
}  // namespace connex::engine
