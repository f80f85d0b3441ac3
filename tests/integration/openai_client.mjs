// openai_client.mjs - the official `openai` npm client (v6) against a running
// llmserve: completions and chat, plain and streaming. Exits 0 when every
// check passes; prints what failed otherwise.
//
// usage: NODE_PATH=<dir>/node_modules node openai_client.mjs BASE_URL MODEL
// (the module is resolved from OPENAI_MODULE_DIR, the npm --prefix directory).
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseURL, model] = process.argv.slice(2);
const require = createRequire(path.join(process.env.OPENAI_MODULE_DIR, 'node_modules', 'x.js'));
const OpenAI = require('openai');
const client = new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0 });

function check(cond, what) {
  if (!cond) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

const common = { model, max_tokens: 8, temperature: 0, ignore_eos: true };

// Completions, plain.
const c = await client.completions.create({ ...common, prompt: 'Once upon a time' });
check(c.object === 'text_completion', 'completion object');
check(typeof c.choices[0].text === 'string', 'completion text');
check(c.choices[0].finish_reason === 'length', 'completion finish_reason');
check(c.usage.completion_tokens === 8, 'completion usage');

// Completions, streaming: same text as the plain one (greedy).
let text = '';
let finish = null;
let usage = null;
const cs = await client.completions.create({
  ...common, prompt: 'Once upon a time', stream: true, stream_options: { include_usage: true },
});
for await (const chunk of cs) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    text += ch.text ?? '';
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
check(text === c.choices[0].text, 'streamed completion == plain');
check(finish === 'length', 'streamed completion finish_reason');
check(usage && usage.completion_tokens === 8, 'streamed completion usage');

// Chat, plain.
const messages = [{ role: 'user', content: 'Say hello.' }];
const r = await client.chat.completions.create({ ...common, messages });
check(r.object === 'chat.completion', 'chat object');
check(r.choices[0].message.role === 'assistant', 'chat role');
check(typeof r.choices[0].message.content === 'string', 'chat content');
check(r.usage.completion_tokens === 8, 'chat usage');

// Chat, streaming.
let role = null;
let content = '';
finish = null;
usage = null;
const rs = await client.chat.completions.create({
  ...common, messages, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of rs) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    if (ch.delta.role) role = ch.delta.role;
    content += ch.delta.content ?? '';
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
check(role === 'assistant', 'streamed chat role');
check(content === r.choices[0].message.content, 'streamed chat == plain');
check(finish === 'length', 'streamed chat finish_reason');
check(usage && usage.completion_tokens === 8, 'streamed chat usage');

// Models, and an error the client turns into its exception type.
const models = await client.models.list();
check(models.data.some((m) => m.id === model), 'models.list');
try {
  await client.completions.create({ ...common, model: 'no-such-model', prompt: 'x' });
  check(false, 'unknown model raises');
} catch (e) {
  check(e instanceof OpenAI.NotFoundError, 'unknown model raises NotFoundError');
}
console.log('all openai client checks passed');
