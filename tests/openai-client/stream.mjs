// Streams completions through the official `openai` client library and prints, per request, one
// JSON line with what the client saw: {"name", "text", "token_ids", "finish_reason", "ids", "chunks"}.
// Usage: node stream.mjs BASE_URL MODEL MAX_TOKENS JOB...   where JOB is a JSON object
//   {"name", "endpoint": "completions"|"chat", "prompt" | "messages", "stream", "seed", "temperature"}
// Prints "streaming" once every streamed request has its first token (the test's cue to kill a
// stage), then "done" after the last line. Exits 1 on any error, printing it.
import OpenAI from "openai";

const [baseURL, model, maxTokens, ...jobs] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120000 });

let waiting = jobs.map((j) => JSON.parse(j)).filter((j) => j.stream).length;
const started = () => {
  if (--waiting === 0) console.log("streaming");
};

async function run(job) {
  const params = { model, max_tokens: Number(maxTokens), seed: job.seed, temperature: job.temperature };
  const out = { name: job.name, text: "", token_ids: [], finish_reason: null, ids: [], chunks: 0 };
  const chat = job.endpoint === "chat";
  const api = chat ? client.chat.completions : client.completions;
  if (chat) params.messages = job.messages; else params.prompt = job.prompt;
  if (!job.stream) {
    const r = await api.create(params);
    const c = r.choices[0];
    out.text = chat ? c.message.content : c.text;
    out.token_ids = c.token_ids;
    out.finish_reason = c.finish_reason;
    out.ids.push(r.id);
    return out;
  }
  const stream = await api.create({ ...params, stream: true });
  let first = true;
  for await (const chunk of stream) {
    out.chunks++;
    if (!out.ids.includes(chunk.id)) out.ids.push(chunk.id);
    for (const c of chunk.choices) {
      out.text += (chat ? c.delta?.content : c.text) ?? "";
      out.token_ids.push(...(c.token_ids ?? []));
      if (c.finish_reason) out.finish_reason = c.finish_reason;
    }
    if (first && out.token_ids.length > 0) {
      first = false;
      started();
    }
  }
  return out;
}

try {
  const results = await Promise.all(jobs.map((j) => run(JSON.parse(j))));
  for (const r of results) console.log(JSON.stringify(r));
  console.log("done");
} catch (e) {
  console.log(`error: ${e.status ?? ""} ${e.message}`);
  process.exit(1);
}
