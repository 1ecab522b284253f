#include "connex/engine/internal/bpe.h"

#include "gtest/gtest.h"

namespace connex::engine::internal {
namespace {

using Ids = std::vector<int32_t>;

absl::flat_hash_map<std::string, int32_t> Vocab() {
  return {{"a", 0},     {"b", 1},      {"c", 2},      {"ab", 3}, {"bc", 4},  {"abc", 5},
          {"<unk>", 6}, {"<0xC3>", 7}, {"<0xA9>", 8}, {"aa", 9}, {"cab", 10}};
}

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"b", "c"}, {"a", "b"}, {"a", "bc"}, {"ab", "c"}, {"a", "a"}, {"x", "y"}};

BpeOptions Options(bool byte_fallback, bool fuse_unk, bool ignore_merges,
                   std::optional<int32_t> unk_id) {
  BpeOptions o;
  o.byte_fallback = byte_fallback;
  o.fuse_unk = fuse_unk;
  o.ignore_merges = ignore_merges;
  o.unk_id = unk_id;
  return o;
}

Ids Encode(const BpeModel& model, std::vector<std::string> words) {
  Ids ids;
  absl::Status s = model.Encode(words, &ids);
  EXPECT_TRUE(s.ok()) << s;
  return ids;
}

TEST(BpeTest, LowestRankFirstLeftmostAmongEqualRanks) {
  BpeModel model(Vocab(), kMerges, {});
  // b+c (rank 0) before a+b (rank 1), then a+bc.
  EXPECT_EQ(Encode(model, {"abc"}), (Ids{5}));
  // a+a at 0 and at 1 have the same rank: the leftmost goes first.
  EXPECT_EQ(Encode(model, {"aaa"}), (Ids{9, 0}));
  EXPECT_EQ(Encode(model, {"cab", "ab"}), (Ids{2, 3, 3}));
  // Merging again from a cached word gives the same ids.
  EXPECT_EQ(Encode(model, {"abc", "abc"}), (Ids{5, 5}));
}

TEST(BpeTest, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  BpeModel model(Vocab(), kMerges, Options(false, false, true, std::nullopt));
  EXPECT_EQ(Encode(model, {"cab"}), (Ids{10}));
  EXPECT_EQ(Encode(model, {"aaa"}), (Ids{9, 0}));
}

TEST(BpeTest, ByteFallbackThenUnknown) {
  BpeModel model(Vocab(), kMerges, Options(true, false, false, 6));
  EXPECT_EQ(Encode(model, {"\xC3\xA9"}), (Ids{7, 8}));  // é: both byte tokens exist
  EXPECT_EQ(Encode(model, {"\xC3\xBC"}), (Ids{6}));     // ü: <0xBC> does not
  // "xy" merges (rank 5) into a piece the vocabulary lacks: one unknown token.
  EXPECT_EQ(Encode(model, {"xy"}), (Ids{6}));
}

TEST(BpeTest, FuseUnknownJoinsRunsWithinACall) {
  BpeModel fused(Vocab(), kMerges, Options(false, true, false, 6));
  EXPECT_EQ(Encode(fused, {"zz", "q", "a", "z"}), (Ids{6, 0, 6}));
  BpeModel plain(Vocab(), kMerges, Options(false, false, false, 6));
  EXPECT_EQ(Encode(plain, {"zz", "q"}), (Ids{6, 6, 6}));
}

TEST(BpeTest, NoUnknownTokenIsAnError) {
  BpeModel model(Vocab(), kMerges, {});
  Ids ids;
  absl::Status s = model.Encode({"aqa"}, &ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"q\""), std::string::npos) << s;
}

TEST(BpeTest, TokenIdSeesOnlyTheVocabulary) {
  BpeModel model(Vocab(), kMerges, {});
  EXPECT_EQ(model.TokenId("abc"), 5);
  EXPECT_EQ(model.TokenId("xy"), std::nullopt);  // a merge result, not a token
  EXPECT_EQ(model.TokenId("x"), std::nullopt);
}

}  // namespace
}  // namespace connex::engine::internal
