// TestEngine: a small deterministic engine for the step protocol's tests. Each stage folds every
// token it sees into a per-request state (a hash chain), so a request's tokens equal those of an
// undisturbed run exactly when every stage saw exactly the same history. It detects the two
// faults the protocol must prevent: a step executed twice on a stage (a start position behind
// the state it holds) and a step run without its state (reported as missing, never executed).
// Thread-safe (a mutex; the node calls it from one thread, tests read the counters).
#ifndef CONNEX_PP_TESTING_TEST_ENGINE_H_
#define CONNEX_PP_TESTING_TEST_ENGINE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "connex/base/mutex.h"
#include "connex/pp/engine.h"

namespace connex::pp::testing {

class TestEngine : public Engine {
 public:
  // `vocab` bounds the sampled tokens to [0, vocab).
  TestEngine(uint32_t stage, uint32_t stages, int32_t vocab = 200);

  absl::StatusOr<TensorDict> ExecuteStep(const TensorDict& in) override;
  std::vector<uint64_t> MissingRequests(const TensorDict& in) const override;
  bool HoldsRequest(uint64_t request_id) const override;
  void Release(uint64_t request_id) override;
  uint64_t OutputBytesPerToken() const override;
  size_t NumHeldRequests() const override { return held_requests(); }
  // State as data: "hash" I64 [positions], the chain's value after each position.
  bool ExportsState() const override;
  int64_t HeldPositions(uint64_t request_id) const override;
  absl::StatusOr<TensorDict> ExportState(uint64_t request_id, int64_t from,
                                         int64_t to) const override;
  absl::Status ImportState(uint64_t request_id, int64_t from, const TensorDict& state) override;
  absl::Status DropState(uint64_t request_id, int64_t from) override;
  // Whether ExportsState (default true): false makes it an engine without the optional calls.
  void SetExportsState(bool exports);
  // Positions imported with ImportState so far (a standby's takeovers).
  uint64_t imported_positions() const;

  // Requests whose state this engine holds now (a test's end: none).
  size_t held_requests() const;
  // The per-token figure reported to the owner (default 8, the I64 hidden row; 0 = unknown).
  void SetOutputBytesPerToken(uint64_t bytes);
  // The next `n` steps fail with Internal (an engine error, not missing state).
  void FailNextSteps(int n);
  // The last stage also returns logits [B, width] F32 (0: none), as a real LM head does.
  void SetEmitLogits(int32_t width);

  // Faults seen: "request 7: step at position 3 but 4 positions are held (executed twice)".
  std::vector<std::string> violations() const;
  uint64_t executions() const;
  // Forget every request's state before each step (a stage that keeps losing its cache).
  void SetAmnesiac(bool amnesiac);

 private:
  struct State {
    std::vector<uint64_t> chain;  // the hash after each position
    int64_t positions() const { return static_cast<int64_t>(chain.size()); }
  };
  std::vector<uint64_t> MissingLocked(const Batch& batch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t stage_;
  const uint32_t stages_;
  const int32_t vocab_;
  mutable connex::Mutex mu_;
  std::map<uint64_t, State> states_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  uint64_t executions_ ABSL_GUARDED_BY(mu_) = 0;
  bool amnesiac_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_per_token_ ABSL_GUARDED_BY(mu_) = 8;
  int fail_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t logits_width_ ABSL_GUARDED_BY(mu_) = 0;
  bool exports_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t imported_ ABSL_GUARDED_BY(mu_) = 0;
};

// The tokens an undisturbed `stages`-stage pipeline of TestEngines generates.
std::vector<int32_t> ReferenceTokens(uint32_t stages, const std::vector<int32_t>& prompt,
                                     int max_new_tokens, int32_t vocab = 200);

}  // namespace connex::pp::testing

#endif  // CONNEX_PP_TESTING_TEST_ENGINE_H_
