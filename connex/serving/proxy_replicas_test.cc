// Where the proxy's replicas come from (proxy_replicas.cc): the stage-0 records of the model with
// an API, and what keeps the model from serving.
#include <gtest/gtest.h>

#include <vector>

#include "connex/serving/proxy.h"

namespace connex::serving {
namespace {

TEST(ChainProblemTest, NamesTheStagesWithoutALiveReplica) {
  auto record = [](uint32_t stage, uint32_t replica) {
    directory::Record r;
    r.lid = Lid{"tiny", stage, 0, replica};
    r.metadata["stages"] = "3";
    return r;
  };
  std::vector<directory::Record> view = {record(0, 0), record(1, 0), record(2, 0), record(0, 1),
                                         record(2, 1)};
  EXPECT_EQ(ChainProblem(view, "tiny"), "");  // stage 1 of r1 is served by r0's
  view.erase(view.begin() + 1);               // no stage 1 at all
  EXPECT_EQ(ChainProblem(view, "tiny"), "no live replica of stage 1 (of 3)");
  EXPECT_EQ(ChainProblem(view, "other"), "");
}

TEST(StageZeroReplicasTest, OnlyStageZeroRecordsOfTheModelWithAnApi) {
  std::vector<directory::Record> view(4);
  view[0].lid = Lid{"tiny", 0, 0, 0};
  view[0].epoch = 3;
  view[0].metadata["http"] = "127.0.0.1:9000";
  view[1].lid = Lid{"tiny", 1, 0, 0};  // stage 1
  view[1].metadata["http"] = "127.0.0.1:9001";
  view[2].lid = Lid{"tiny", 0, 0, 1};  // no API
  view[3].lid = Lid{"other", 0, 0, 0};
  view[3].metadata["http"] = "127.0.0.1:9003";
  std::vector<Replica> r = StageZeroReplicas(view, "tiny");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].http_address, "127.0.0.1:9000");
  EXPECT_EQ(r[0].name, "tiny/g0/s0/r0@3");
}

}  // namespace
}  // namespace connex::serving
