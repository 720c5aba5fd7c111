// The official openai client, unchanged, against one node's gateway:
//
//	node check.mjs BASE_URL MODEL
//
// BASE_URL is http://<node>:<gateway port>/v1 and MODEL a deployment served
// by the fake engine. It lists the models, asks for a chat completion
// (plain and streamed), a completion and an embedding, and sends an
// unknown model, checking each answer as a client would. On success it
// prints one JSON object saying what it saw, for the Go test to check
// (scenarios' TestOpenAISDKThroughTheGateway); on the first failure it
// prints the reason to stderr and exits 1.
import OpenAI from "openai";
import { VERSION } from "openai/version";

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error("usage: node check.mjs BASE_URL MODEL");
  process.exit(2);
}

// The gateway is open in the test; the SDK insists on some key. No retries:
// whatever fails must be the gateway's answer, not hidden by the client.
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 20_000 });

function check(cond, what) {
  if (!cond) throw new Error(what);
}

const prompt = "say hello";
const seen = { sdk: VERSION };

// Model listing: every page, through the SDK's pagination.
seen.models = [];
for await (const m of client.models.list()) {
  check(m.object === "model", `models: object ${JSON.stringify(m.object)}`);
  seen.models.push(m.id);
}

// A plain chat completion, with the response headers the gateway adds.
{
  const { data, response } = await client.chat.completions
    .create({ model, messages: [{ role: "user", content: prompt }] })
    .withResponse();
  check(data.object === "chat.completion", `chat: object ${data.object}`);
  check(data.choices.length === 1, `chat: ${data.choices.length} choices`);
  const c = data.choices[0];
  check(c.message.role === "assistant", `chat: role ${c.message.role}`);
  check(data.usage && data.usage.completion_tokens > 0, "chat: no usage");
  seen.chat = { text: c.message.content, finish: c.finish_reason, node: response.headers.get("llmgw-node") ?? "" };
}

// A streamed chat completion: every chunk read; the end is a chunk with a
// finish reason, then the usage chunk that stream_options asks for, then
// [DONE], which ends the SDK's iteration (an error event would throw).
{
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: prompt }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let chunks = 0;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    chunks++;
    check(chunk.object === "chat.completion.chunk", `stream: object ${chunk.object}`);
    check(finish === null || chunk.choices.length === 0, "stream: a choice after the finish reason");
    for (const ch of chunk.choices) {
      text += ch.delta?.content ?? "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  check(finish !== null, "stream: ended without a finish reason");
  check(usage !== null && usage.completion_tokens > 0, "stream: no usage chunk");
  seen.stream = { text, finish, chunks };
}

// A (legacy) completion.
{
  const data = await client.completions.create({ model, prompt, max_tokens: 16 });
  check(data.object === "text_completion", `completion: object ${data.object}`);
  seen.completion = { text: data.choices[0].text, finish: data.choices[0].finish_reason };
}

// An embedding: the SDK asks for base64 and decodes it to floats itself.
{
  const data = await client.embeddings.create({ model, input: prompt });
  check(data.data.length === 1, `embeddings: ${data.data.length} items`);
  const v = data.data[0].embedding;
  const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  seen.embedding = { dims: v.length, norm: Math.round(norm * 1000) / 1000 };
}

// An unknown model is the SDK's NotFoundError (HTTP 404).
try {
  await client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: prompt }] });
  throw new Error("unknown model: answered");
} catch (e) {
  check(e instanceof OpenAI.NotFoundError, `unknown model: ${e.constructor.name}: ${e.message}`);
  seen.unknown_model = { error: e.constructor.name, status: e.status };
}

console.log(JSON.stringify(seen));
