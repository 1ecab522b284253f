#include "connex/serving/jinja/lexer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving::jinja {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Values(const std::vector<Token>& tokens) {
  std::vector<std::string> out;
  for (const Token& t : tokens) out.push_back(t.value);
  return out;
}

TEST(LexerTest, SplitsTextTagsAndOperators) {
  auto tokens = Tokenize("Hi {{ a.b[0] ~ 'x' }}{% if n >= -1 and m != 2 %}y{% endif %}");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(Values(*tokens),
            (std::vector<std::string>{"Hi ", "{{", "a",  ".",  "b",  "[",     "0",  "]",   "~",
                                      "x",   "}}", "{%", "if", "n",  ">=",    "-1", "and", "m",
                                      "!=",  "2",  "%}", "y",  "{%", "endif", "%}"}));
  EXPECT_EQ((*tokens)[9].type, TokenType::kString);
  EXPECT_EQ((*tokens)[15].type, TokenType::kNumber);  // a sign after an operator is the number's
}

TEST(LexerTest, ASignAfterAValueIsAnOperator) {
  auto tokens = Tokenize("{{ n-1 }}{{ (x) - 2 }}{{ -x }}");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)[2].type, TokenType::kAdditive);
  EXPECT_EQ((*tokens)[9].type, TokenType::kAdditive);
  EXPECT_EQ((*tokens)[13].type, TokenType::kUnary);
}

TEST(LexerTest, WhitespaceControlAppliesBeforeTokens) {
  auto tokens = Tokenize("a \n  {%- if x -%}\n  b  {#- c -#}  d\n  {% endif %}\ne");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  std::vector<std::string> text;
  for (const Token& t : *tokens) {
    if (t.type == TokenType::kText) text.push_back(t.value);
  }
  // `-` strips on its side; lstrip_blocks drops the indentation before `{%`, trim_blocks the
  // newline after `%}`.
  EXPECT_EQ(text, (std::vector<std::string>{"a", "b", "d\n", "e"}));
}

TEST(LexerTest, PositionsAreInTheOriginalText) {
  auto tokens = Tokenize("x\n    {% if y %}\n{{ z }}");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const Token& open = (*tokens)[1];
  EXPECT_EQ(open.type, TokenType::kOpenStatement);
  EXPECT_EQ(open.position.line, 2);
  EXPECT_EQ(open.position.column, 5);
  EXPECT_EQ(tokens->back().position.line, 3);
}

TEST(LexerTest, ErrorsNameTheCulprit) {
  EXPECT_THAT(std::string(Tokenize("{{ 'open }}").status().message()),
              HasSubstr("template line 1 column 4: unterminated string literal"));
  EXPECT_THAT(std::string(Tokenize("ok\n{{ a @ b }}").status().message()),
              HasSubstr("template line 2 column 6: unexpected character '@'"));
  EXPECT_THAT(std::string(Tokenize("{# open").status().message()),
              HasSubstr("unterminated comment"));
  EXPECT_THAT(std::string(Tokenize("{{ 'a\\zb' }}").status().message()),
              HasSubstr("unknown escape \\z"));
  EXPECT_THAT(std::string(Tokenize("{{ x").status().message()),
              HasSubstr("unexpected end of template inside a tag"));
}

TEST(LexerTest, StringEscapes) {
  auto tokens = Tokenize(R"({{ "a\tb\n\"q\"\\\u00e9\x41" }})");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)[1].value,
            "a\tb\n\"q\"\\\xC3\xA9"
            "A");
}

}  // namespace
}  // namespace connex::serving::jinja
