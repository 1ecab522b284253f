// Renders the interpreter's unit cases (connex/serving/jinja/testdata/template_cases.json) with
// @huggingface/jinja, the renderer transformers.js uses, for connex/serving/jinja/template_test.cc.
//
//   node render_jinja_cases.js CASES.json            prints [{"name", "ok", "text" | "error"}]
//   node render_jinja_cases.js CASES.json --update   writes each case's "expect" (the reference's
//                                                    text, or null where it refuses) into the file
"use strict";
const fs = require("fs");
const { Template } = require("@huggingface/jinja");

const path = process.argv[2];
const spec = JSON.parse(fs.readFileSync(path, "utf8"));
const out = spec.cases.map((c) => {
  try {
    return { name: c.name, ok: true, text: new Template(c.template).render(c.variables) };
  } catch (e) {
    return { name: c.name, ok: false, error: String(e && e.message !== undefined ? e.message : e) };
  }
});
if (process.argv[3] === "--update") {
  spec.cases.forEach((c, i) => { c.expect = out[i].ok ? out[i].text : null; });
  fs.writeFileSync(path, JSON.stringify(spec, null, 1) + "\n");
} else {
  process.stdout.write(JSON.stringify(out));
}
