// Prints what the JavaScript reference (transformers.js' tokenizers, @lenml/tokenizers) makes of
// the test corpus with one model family's real tokenizer files, as JSON on stdout:
//   {"corpus": [{"ids", "ids_plain", "text", "text_skip", "text_raw"}...],
//    "random": [{"ids", "text", "text_skip", "text_raw"}...]}
// ids: encode(s) (special tokens added); ids_plain: without them; text: decode(ids); text_skip:
// with skip_special_tokens; text_raw: without clean_up_tokenization_spaces. "random" decodes
// pseudo-random id sequences (a fixed xorshift), byte-fallback and special tokens included.
// Usage: NODE_PATH=tests/hf-tokenizers/node_modules node hf_reference.js FAMILY CORPUS.json
//        [OVERRIDES.json]   (top-level keys of tokenizer.json to replace, e.g. pre_tokenizer)
"use strict";
const fs = require("fs");

const [family, corpusPath, overridesPath] = process.argv.slice(2);
const { fromPreTrained } = require(`@lenml/tokenizer-${family}`);
const overrides = overridesPath ? JSON.parse(fs.readFileSync(overridesPath, "utf8")) : null;
const tokenizer = fromPreTrained(overrides ? { tokenizerJSON: overrides } : undefined);
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));

function decodeAll(ids) {
  // decode() refuses an empty list; the text of no tokens is "".
  if (ids.length === 0) return { text: "", text_skip: "", text_raw: "" };
  return {
    text: tokenizer.decode(ids),
    text_skip: tokenizer.decode(ids, { skip_special_tokens: true }),
    text_raw: tokenizer.decode(ids, { clean_up_tokenization_spaces: false }),
  };
}

const out = { corpus: [], random: [] };
for (const s of corpus) {
  const ids = tokenizer.encode(s);
  const ids_plain = tokenizer.encode(s, { add_special_tokens: false });
  out.corpus.push({ ids, ids_plain, ...decodeAll(ids) });
}

let state = 2463534242;
function next(n) {
  // xorshift32
  state = (state ^ (state << 13)) >>> 0;
  state = (state ^ (state >>> 17)) >>> 0;
  state = (state ^ (state << 5)) >>> 0;
  return state % n;
}
const vocabSize = tokenizer.model.vocab.length;
const special = tokenizer.all_special_ids;
const byteIds = [];
for (let b = 0; b < 256; b++) {
  const id = tokenizer.model.tokens_to_ids.get(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
  if (id !== undefined) byteIds.push(id);
}
for (let n = 0; n < 300; n++) {
  const ids = [];
  const length = 1 + next(24);
  for (let i = 0; i < length; i++) {
    const kind = next(10);
    if (kind === 0 && special.length > 0) ids.push(special[next(special.length)]);
    else if (kind <= 3 && byteIds.length > 0) ids.push(byteIds[next(byteIds.length)]);
    else ids.push(next(vocabSize));
  }
  out.random.push({ ids, ...decodeAll(ids) });
}
process.stdout.write(JSON.stringify(out));
