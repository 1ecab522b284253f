#include "connex/serving/jinja/template.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving::jinja {
namespace {

using ::testing::HasSubstr;

const std::string kCasesPath =
    std::string(CONNEX_SOURCE_DIR) + "/connex/serving/jinja/testdata/template_cases.json";

nlohmann::ordered_json Cases() {
  std::ifstream in(kCasesPath);
  return nlohmann::ordered_json::parse(in)["cases"];
}

absl::StatusOr<std::string> RenderCase(const nlohmann::ordered_json& c) {
  auto parsed = Template::Parse(c["template"].get<std::string>());
  if (!parsed.ok()) return parsed.status();
  return parsed->Render(c["variables"]);
}

// One case per construct and per error of the subset (testdata/template_cases.json): a case's
// "expect" is what @huggingface/jinja renders (written by tests/hf-tokenizers/
// render_jinja_cases.js --update), and a case with "error" must fail with that in its message.
TEST(TemplateTest, EveryConstructRendersAsTheReferenceAndEveryErrorNamesItsCulprit) {
  int checked = 0;
  for (const auto& c : Cases()) {
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["template"].get<std::string>());
    auto got = RenderCase(c);
    if (c.contains("error")) {
      ASSERT_FALSE(got.ok()) << "rendered: " << *got;
      EXPECT_THAT(std::string(got.status().message()), HasSubstr(c["error"].get<std::string>()));
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    } else {
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, c["expect"].get<std::string>());
    }
    ++checked;
  }
  EXPECT_GT(checked, 50);
}

std::string FindNode() {
  for (std::string_view path = std::getenv("PATH") ? std::getenv("PATH") : ""; !path.empty();) {
    const size_t colon = std::min(path.find(':'), path.size());
    const std::string candidate = std::string(path.substr(0, colon)) + "/node";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    path.remove_prefix(std::min(colon + 1, path.size()));
  }
  return "";
}

// The stored expectations are still the reference's: render the cases with @huggingface/jinja now
// and compare. Where the reference refuses a case, we refuse it too; only cases marked
// "subset_limit" (a macro, nesting over 200 levels, a range of over 2^20 items) does the reference
// render and we refuse.
TEST(TemplateTest, TheCasesAgreeWithTheLiveReference) {
  const std::string dir = std::string(CONNEX_SOURCE_DIR) + "/tests/hf-tokenizers";
  if (!std::filesystem::exists(dir + "/node_modules/@huggingface/jinja/package.json")) {
    GTEST_SKIP() << "@huggingface/jinja is not installed in " << dir
                 << "/node_modules (scripts/install-deps.sh runs npm ci there)";
  }
  const std::string node = FindNode();
  if (node.empty()) GTEST_SKIP() << "node is not on PATH";
  const std::string command =
      "cd '" + dir + "' && '" + node + "' render_jinja_cases.js '" + kCasesPath + "'";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[65536];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << command;
  const auto reference = nlohmann::ordered_json::parse(output);
  const auto cases = Cases();
  ASSERT_EQ(reference.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i]["name"].get<std::string>());
    auto got = RenderCase(cases[i]);
    if (reference[i]["ok"].get<bool>()) {
      if (cases[i].value("subset_limit", false)) {
        EXPECT_FALSE(got.ok()) << "a case marked subset_limit rendered: " << *got;
        continue;
      }
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, reference[i]["text"].get<std::string>());
    } else {
      EXPECT_FALSE(got.ok()) << "the reference refused (" << reference[i]["error"]
                             << ") but we rendered: " << *got;
    }
  }
}

TEST(TemplateTest, ErrorsNameTheLineAndColumnOfTheTemplateAsWritten) {
  // Line 3's indentation is removed by lstrip_blocks before lexing; the column is still the one
  // in the file.
  auto parsed =
      Template::Parse("line one\n{% if true %}\n    {% set x = 1 %}{{ x | nosuch }}\n{% endif %}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto rendered = parsed->Render(nlohmann::ordered_json::object());
  EXPECT_THAT(
      std::string(rendered.status().message()),
      HasSubstr("template line 3 column 27: filter 'nosuch' is not supported on a integer"));
  auto bad = Template::Parse("{% for x in xs %}\n  {{ x. }}\n{% endfor %}");
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("template line 2 column 9: expected an expression, found '}}'"));
}

TEST(TemplateTest, VariablesMustBeAnObject) {
  auto parsed = Template::Parse("x");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->Render(nlohmann::ordered_json::array()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TemplateTest, AParsedTemplateRendersFromSeveralThreadsAtOnce) {
  auto parsed = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m }}"
      "{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::vector<std::thread> threads;
  std::vector<std::string> results(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      nlohmann::ordered_json variables = {{"messages", nlohmann::ordered_json::array()}};
      for (int i = 0; i <= t; ++i) variables["messages"].push_back(std::to_string(t));
      for (int round = 0; round < 200; ++round) results[t] = *parsed->Render(variables);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(results[0], "01");
  EXPECT_EQ(results[3], "33334");
}

}  // namespace
}  // namespace connex::serving::jinja
