#include "connex/serving/deployment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include "connex/serving/router.h"

namespace connex::serving {
namespace {

using ::testing::HasSubstr;

directory::Record StageRecord(const std::string& model, uint32_t stage, uint32_t replica,
                              uint32_t stages, uint64_t epoch, std::string http = "") {
  directory::Record r;
  r.lid = Lid{model, stage, 0, replica};
  r.epoch = epoch;
  r.metadata["stages"] = std::to_string(stages);
  if (!http.empty()) r.metadata["http"] = http;
  return r;
}

TEST(ServedModelsTest, GroupsChainsAndFindsAStageWithNoLiveReplica) {
  std::vector<directory::Record> records = {
      StageRecord("tiny", 0, 0, 3, 11, "127.0.0.1:9000"), StageRecord("tiny", 1, 0, 3, 12),
      StageRecord("tiny", 0, 1, 3, 21, "127.0.0.1:9001"), StageRecord("tiny", 1, 1, 3, 22),
      StageRecord("big", 0, 0, 2, 5, "127.0.0.1:9100"),   StageRecord("big", 1, 3, 2, 6),
  };
  directory::Record plain;  // not a served stage: no "stages"
  plain.lid = Lid{"tiny", 2, 0, 0};
  records.push_back(plain);
  std::vector<ServedModel> models = ServedModels(records);
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].model, "big");
  EXPECT_TRUE(models[0].ready());
  EXPECT_EQ(models[1].model, "tiny");
  EXPECT_EQ(models[1].stages, 3u);
  EXPECT_EQ(models[1].chains.size(), 2u);
  EXPECT_EQ(models[1].missing_stages, std::vector<uint32_t>{2});

  std::map<std::string, HealthProbe> health = {{"127.0.0.1:9000", {200, ""}},
                                               {"127.0.0.1:9001", {0, "Connection refused"}}};
  std::string table = RenderServedModels(models, health);
  EXPECT_THAT(table, HasSubstr("model tiny: 3 stages, 2 replicas, NOT READY: no live replica of "
                               "stage 2"));
  EXPECT_THAT(table, HasSubstr("model big: 2 stages, 2 replicas, ready"));
  EXPECT_THAT(table, HasSubstr("epoch 12"));
  EXPECT_THAT(table, HasSubstr("missing"));
  EXPECT_THAT(table, HasSubstr("unreachable (Connection refused)"));
  nlohmann::json json = ServedModelsJson(models, health);
  EXPECT_EQ(json[1]["ready"], false);
  EXPECT_EQ(json[1]["replicas"][0]["http"], "127.0.0.1:9000");
  EXPECT_EQ(json[1]["replicas"][0]["health"]["status"], 200);
  EXPECT_TRUE(json[1]["replicas"][0]["stages"][2].is_null());
  EXPECT_EQ(json[1]["replicas"][1]["stages"][1]["epoch"], 22);
}

TEST(ServedModelsTest, NoServedModelSaysSo) {
  EXPECT_THAT(RenderServedModels({}, {}), HasSubstr("no served model"));
}

// `connexctl serving` exits 0 only when this holds (it used to exit 0 on NOT READY).
TEST(ServedModelsTest, AllServingNeedsEveryStageAndAHealthyStageZero) {
  std::vector<directory::Record> records = {StageRecord("tiny", 0, 0, 2, 11, "127.0.0.1:9000"),
                                            StageRecord("tiny", 1, 0, 2, 12),
                                            StageRecord("tiny", 0, 1, 2, 21, "127.0.0.1:9001")};
  std::vector<ServedModel> models = ServedModels(records);
  const std::map<std::string, HealthProbe> one_healthy = {{"127.0.0.1:9000", {503, "starting"}},
                                                          {"127.0.0.1:9001", {200, ""}}};
  const std::map<std::string, HealthProbe> none_healthy = {{"127.0.0.1:9000", {503, "x"}},
                                                           {"127.0.0.1:9001", {0, "refused"}}};
  EXPECT_TRUE(AllServing(models, one_healthy, /*probed=*/true));
  EXPECT_FALSE(AllServing(models, none_healthy, /*probed=*/true));
  EXPECT_TRUE(AllServing(models, {}, /*probed=*/false));
  records.erase(records.begin() + 1);  // stage 1 gone
  EXPECT_FALSE(AllServing(ServedModels(records), one_healthy, /*probed=*/true));
  EXPECT_FALSE(AllServing({}, {}, /*probed=*/false)) << "no served model is not serving";
}

TEST(ProbeHealthTest, ReadsTheStatusAndReasonOrNamesWhyThereWasNoAnswer) {
  Router router;
  std::atomic<bool> ready{false};
  router.Add("GET", "/health", [&ready](std::shared_ptr<HttpExchange> x) {
    x->Respond(JsonResponse(
        ready ? 200 : 503,
        ready ? R"({"status":"ok"})" : R"({"status":"unavailable","reason":"stage 2 missing"})"));
  });
  auto server = StartHttpServer({}, router.AsHandler());
  ASSERT_TRUE(server.ok()) << server.status();
  HealthProbe probe = ProbeHealth((*server)->address(), 5000);
  EXPECT_EQ(probe.status, 503);
  EXPECT_EQ(probe.detail, "stage 2 missing");
  ready = true;
  EXPECT_EQ(ProbeHealth((*server)->address(), 5000).status, 200);
  const std::string address = (*server)->address();
  (*server)->Stop();
  probe = ProbeHealth(address, 2000);
  EXPECT_EQ(probe.status, 0);
  EXPECT_FALSE(probe.detail.empty());
  EXPECT_EQ(ProbeHealth("nonsense", 100).status, 0);
}

}  // namespace
}  // namespace connex::serving
