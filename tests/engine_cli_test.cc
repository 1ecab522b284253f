// connex-mkmodel and connex-generate end to end: the reference run's output does not change with
// batching, stages, chunked prefill or a recompute, and bad input gives a clear error and a
// non-zero exit.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

using ::testing::HasSubstr;

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr
};

Result Shell(const std::string& command) {
  Result run;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) run.out.append(buf.data(), n);
  int status = ::pclose(pipe);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::string Bin(const std::string& name) {
  const char* dir = std::getenv("CONNEX_BIN_DIR");
  return std::string(dir ? dir : "build/bin") + "/" + name;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(text.substr(start, nl - start));
  }
  return lines;
}

class EngineCliTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/engine-cli." + std::to_string(::getpid());
    ASSERT_EQ(Shell("mkdir -p " + dir_).code, 0);
    model_ = dir_ + "/model.safetensors";
    Result mk = Shell(Bin("connex-mkmodel") + " --out " + model_ +
                      " --layers 4 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --seed 7");
    ASSERT_EQ(mk.code, 0) << mk.out;
    EXPECT_THAT(mk.out, HasSubstr("4 layers, dim 64"));
    prompts_ = {"Hello, world", "a", "The quick brown fox", "\xc3\xa9t\xc3\xa9 \xe2\x82\xac"};
    std::ofstream(dir_ + "/prompts.txt") << prompts_[0] << "\n"
                                         << prompts_[1] << "\n"
                                         << prompts_[2] << "\n"
                                         << prompts_[3] << "\n";
  }
  void TearDown() override { Shell("rm -rf " + dir_); }

  std::string Generate(const std::string& args) {
    return Bin("connex-generate") + " --model " + model_ + " --max-tokens 12 --ignore-eos " + args;
  }

  std::string dir_, model_;
  std::vector<std::string> prompts_;
};

TEST_F(EngineCliTest, OutputIsTheSameAloneBatchedStagedAndRecomputed) {
  std::vector<std::string> alone;
  for (const std::string& p : prompts_) {
    Result r = Shell(Generate("--json --prompt '" + p + "'"));
    ASSERT_EQ(r.code, 0) << r.out;
    ASSERT_EQ(Lines(r.out).size(), 1u) << r.out;
    nlohmann::json j = nlohmann::json::parse(Lines(r.out)[0]);
    EXPECT_EQ(j["tokens"].size(), 12u);
    EXPECT_TRUE(j["text"].is_string());
    EXPECT_EQ(r.out.find("{\"tokens\":"), 0u);  // the documented key order
    alone.push_back(Lines(r.out)[0]);
  }
  EXPECT_NE(alone[0], alone[2]);
  for (const char* extra :
       {"", "--stages 2", "--stages 4 --threads 1", "--recompute-at 1", "--recompute-at 5",
        "--max-batch 2 --prefill-chunk 3 --stages 3 --recompute-at 4"}) {
    Result r =
        Shell(Generate("--json --prompts-file " + dir_ + "/prompts.txt " + std::string(extra)));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(Lines(r.out), alone) << extra;
  }
}

TEST_F(EngineCliTest, PlainTextOutput) {
  Result json = Shell(Generate("--json --prompt abc"));
  Result text = Shell(Generate("--prompt abc"));
  ASSERT_EQ(text.code, 0);
  std::string bytes;
  nlohmann::json parsed = nlohmann::json::parse(json.out);
  for (int t : parsed["tokens"]) {
    if (t < 256) bytes.push_back(static_cast<char>(t));
  }
  EXPECT_EQ(text.out, bytes + "\n");
}

TEST_F(EngineCliTest, ErrorsNameTheProblem) {
  Result missing =
      Shell(Bin("connex-generate") + " --model " + dir_ + "/nope.safetensors --prompt x");
  EXPECT_NE(missing.code, 0);
  EXPECT_THAT(missing.out, HasSubstr("nope.safetensors: cannot open"));

  ASSERT_EQ(Shell("head -c 5000 " + model_ + " > " + dir_ + "/cut.safetensors").code, 0);
  Result cut = Shell(Bin("connex-generate") + " --model " + dir_ + "/cut.safetensors --prompt x");
  EXPECT_NE(cut.code, 0);
  EXPECT_THAT(cut.out, HasSubstr("truncated"));

  ASSERT_EQ(Shell("printf 'garbage garbage' > " + dir_ + "/junk.safetensors").code, 0);
  Result junk = Shell(Bin("connex-generate") + " --model " + dir_ + "/junk.safetensors --prompt x");
  EXPECT_NE(junk.code, 0);
  EXPECT_THAT(junk.out, HasSubstr("junk.safetensors: header length"));

  Result flag = Shell(Generate("--prompt x --max-tokens lots"));
  EXPECT_EQ(flag.code, 2);
  EXPECT_THAT(flag.out, HasSubstr("--max-tokens"));
  Result none = Shell(Bin("connex-generate") + " --model " + model_);
  EXPECT_EQ(none.code, 2);
  EXPECT_THAT(none.out, HasSubstr("--prompt or --prompts-file"));
  Result stages = Shell(Generate("--prompt x --stages 5"));
  EXPECT_EQ(stages.code, 2);
  EXPECT_THAT(stages.out, HasSubstr("cannot split 4 layers into 5 stages"));
  Result file = Shell(Generate("--prompts-file " + dir_ + "/absent.txt"));
  EXPECT_NE(file.code, 0);
  EXPECT_THAT(file.out, HasSubstr("absent.txt"));
  Result threads = Shell("CONNEX_ENGINE_THREADS=zero " + Generate("--prompt x"));
  EXPECT_NE(threads.code, 0);
  EXPECT_THAT(threads.out, HasSubstr("CONNEX_ENGINE_THREADS"));

  Result heads =
      Shell(Bin("connex-mkmodel") + " --out " + dir_ + "/m.safetensors --dim 64 --heads 5");
  EXPECT_EQ(heads.code, 2);
  EXPECT_THAT(heads.out, HasSubstr("'num_attention_heads' 5"));
  Result head_dim =
      Shell(Bin("connex-mkmodel") + " --out " + dir_ + "/m.safetensors --head-dim 32");
  EXPECT_EQ(head_dim.code, 2);
  EXPECT_THAT(head_dim.out, HasSubstr("the one-file form (__metadata__) carries a plain Llama"));
}

// connex-mkmodel --hf writes a Hugging Face directory (shards, index, configs, the tokenizer
// files it is given) that connex-generate runs, with the same tokens however it is split.
TEST_F(EngineCliTest, HfDirectoryRunsTheSameAloneStagedAndRecomputed) {
  const std::string hf = dir_ + "/qwen";
  ASSERT_EQ(Shell("mkdir -p " + dir_ + "/tok && echo '{}' > " + dir_ + "/tok/tokenizer.json").code,
            0);
  Result mk = Shell(Bin("connex-mkmodel") + " --hf " + hf +
                    " --config qwen2.5-0.5b --layers 3 --hidden 64 --heads 4 --kv-heads 2"
                    " --ffn 96 --shard-size 64K --tokenizer-from " +
                    dir_ + "/tok");
  ASSERT_EQ(mk.code, 0) << mk.out;
  EXPECT_THAT(mk.out, HasSubstr("qwen2.5-0.5b-shaped (Qwen/Qwen2.5-0.5B-Instruct), 3 layers"));
  EXPECT_THAT(mk.out, HasSubstr("BF16 in "));
  std::ifstream config_file(hf + "/config.json");
  nlohmann::json config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config["model_type"], "qwen2");
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  std::ifstream index_file(hf + "/model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(index_file);
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
  EXPECT_GE(shards.size(), 3u);
  EXPECT_EQ(shards.begin()->find("model-00001-of-0000"), 0u) << *shards.begin();
  EXPECT_TRUE(index["weight_map"].contains("model.layers.2.self_attn.v_proj.bias"));
  EXPECT_FALSE(index["weight_map"].contains("lm_head.weight"));
  EXPECT_EQ(Shell("test -f " + hf + "/tokenizer.json -a -f " + hf + "/generation_config.json").code,
            0);

  auto run = [&](const std::string& extra) {
    return Shell(Bin("connex-generate") + " --model " + hf +
                 " --max-tokens 10 --ignore-eos --json --prompt-tokens 151643,17,33,400,5 " +
                 extra);
  };
  Result alone = run("");
  ASSERT_EQ(alone.code, 0) << alone.out;
  EXPECT_EQ(nlohmann::json::parse(alone.out)["tokens"].size(), 10u);
  for (const char* extra : {"--stages 2", "--stages 3 --threads 1", "--recompute-at 4",
                            "--prefill-chunk 2 --stages 3 --recompute-at 2"}) {
    Result r = run(extra);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out, alone.out) << extra;
  }

  Result bad_id = run("--prompt-tokens 1,x");
  EXPECT_EQ(bad_id.code, 2);
  EXPECT_THAT(bad_id.out, HasSubstr("--prompt-tokens"));
  Result out_of_vocab =
      Shell(Bin("connex-generate") + " --model " + hf + " --prompt-tokens 1,151936");
  EXPECT_NE(out_of_vocab.code, 0);
  EXPECT_THAT(out_of_vocab.out, HasSubstr("token 151936 is outside the vocabulary [0, 151936)"));
  Result vocab =
      Shell(Bin("connex-mkmodel") + " --hf " + hf + " --config qwen2.5-0.5b --vocab 600");
  EXPECT_EQ(vocab.code, 2);
  EXPECT_THAT(vocab.out, HasSubstr("'bos_token_id' 151643 must be < 'vocab_size' 600 (--vocab"));
  Result preset = Shell(Bin("connex-mkmodel") + " --hf " + hf + " --config gpt2");
  EXPECT_EQ(preset.code, 2);
  EXPECT_THAT(preset.out, HasSubstr("--config \"gpt2\" is no preset (llama-3.2-1b, "
                                    "llama-3.1-8b, qwen2.5-0.5b, tinyllama-1.1b, smollm-135m, "
                                    "mistral-7b)"));
  Result no_config = Shell(Bin("connex-mkmodel") + " --hf " + hf);
  EXPECT_EQ(no_config.code, 2);
  EXPECT_THAT(no_config.out, HasSubstr("--config"));
  Result tokenizer = Shell(Bin("connex-mkmodel") + " --hf " + hf +
                           " --config tinyllama-1.1b --layers 1 --hidden 64 --heads 4 --kv-heads 2"
                           " --ffn 64 --vocab 300 --tokenizer-from " +
                           dir_ + "/absent");
  EXPECT_EQ(tokenizer.code, 2);
  EXPECT_THAT(tokenizer.out,
              HasSubstr("--tokenizer-from: no tokenizer.json in " + dir_ + "/absent nor in " +
                        dir_ + "/absent/tokenizer-llama2/models"));
}

}  // namespace
