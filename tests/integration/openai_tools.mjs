// openai_tools.mjs - tool calling and structured output through the official
// `openai` npm client (v6), sampled at temperature 1 with seeds 1..N:
//   1. tools, tool_choice "required", one call, plain: client.chat.completions.parse()
//   2. tools, a named tool_choice, streamed: client.chat.completions.stream(), whose
//      own accumulation of delta.tool_calls builds the final message
//   3. response_format json_schema, plain: parse() (message.parsed)
//   4. response_format json_schema, streamed: stream() (its accumulated content)
// The client parses the arguments and contents itself (strict tools and
// schemas: JSON.parse, or it throws); every text is then judged by
// scripts/validate-json (Python's json module and the jsonschema package)
// against its schema. 100% must pass. Streams are also checked for OpenAI's
// delta shape: a call's first delta has index, id, type "function", the name
// and arguments "", later ones argument fragments only.
//
// usage: OPENAI_MODULE_DIR=<npm prefix> node openai_tools.mjs BASE_URL MODEL VALIDATE_JSON [N]
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseURL, model, validateJson, nArg] = process.argv.slice(2);
const N = Number(nArg ?? 50);
const require = createRequire(path.join(process.env.OPENAI_MODULE_DIR, 'node_modules', 'x.js'));
const OpenAI = require('openai');
const client = new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0 });

let failed = false;
function check(cond, what) {
  if (!cond) {
    console.error(`FAIL: ${what}`);
    failed = true;
  }
  return cond;
}

// Bounded in every dimension so a sampled document ends within max_tokens.
const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 8 },
    unit: { enum: ['c', 'f'] },
    days: { type: 'integer' },
    alerts: { type: 'boolean' },
  },
  required: ['city', 'unit', 'days', 'alerts'],
  additionalProperties: false,
};
const lookup = {
  type: 'object',
  properties: { query: { type: 'string', maxLength: 10 }, exact: { type: 'boolean' } },
  required: ['query', 'exact'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: weather, strict: true } },
  { type: 'function', function: { name: 'lookup', description: 'Search the notes',
    parameters: lookup, strict: true } },
];
const schemaOf = { get_weather: weather, lookup };
const story = {
  type: 'object',
  properties: {
    title: { type: 'string', maxLength: 12 },
    pages: { type: 'integer' },
    happy: { type: 'boolean' },
    mood: { enum: ['calm', 'wild'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 5 }, maxItems: 2 },
  },
  required: ['title', 'pages', 'happy', 'mood'],
  additionalProperties: false,
};
const messages = [{ role: 'user', content: 'What is the weather in Paris? Then tell a story.' }];
const common = { model, messages, temperature: 1, max_tokens: 400 };
const cases = [];  // {schema, text} for validate-json

async function requiredPlain(seed) {
  const r = await client.chat.completions.parse({
    ...common, seed, tools, tool_choice: 'required', parallel_tool_calls: false,
  });
  const c = r.choices[0];
  if (!check(c.finish_reason === 'tool_calls', `required #${seed}: finish_reason ${c.finish_reason}`)) return;
  check(c.message.content === null, `required #${seed}: content null`);
  check(c.message.tool_calls.length === 1, `required #${seed}: one call`);
  for (const tc of c.message.tool_calls) {
    check(/^call_[0-9a-f]{24}$/.test(tc.id), `required #${seed}: id ${tc.id}`);
    check(tc.type === 'function', `required #${seed}: type`);
    const schema = schemaOf[tc.function.name];
    if (!check(schema !== undefined, `required #${seed}: name ${tc.function.name}`)) continue;
    check(typeof tc.function.parsed_arguments === 'object', `required #${seed}: parsed by the client`);
    cases.push({ schema, text: tc.function.arguments });
  }
}

async function namedStream(seed) {
  const stream = client.chat.completions.stream({
    ...common, seed, tools, tool_choice: { type: 'function', function: { name: 'lookup' } },
  });
  const seen = new Map();  // index -> number of deltas
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      for (const d of ch.delta.tool_calls ?? []) {
        const n = seen.get(d.index) ?? 0;
        if (n === 0) {
          check(typeof d.id === 'string' && d.type === 'function' && d.function.name === 'lookup' &&
                d.function.arguments === '', `named #${seed}: first delta ${JSON.stringify(d)}`);
        } else {
          check(d.id === undefined && d.function.name === undefined &&
                typeof d.function.arguments === 'string', `named #${seed}: fragment ${JSON.stringify(d)}`);
        }
        seen.set(d.index, n + 1);
      }
    }
  }
  const r = await stream.finalChatCompletion();
  const c = r.choices[0];
  if (!check(c.finish_reason === 'tool_calls', `named #${seed}: finish_reason ${c.finish_reason}`)) return;
  check(c.message.tool_calls.length === 1 && seen.size === 1, `named #${seed}: one call`);
  const tc = c.message.tool_calls[0];
  check(tc.function.name === 'lookup', `named #${seed}: the named tool`);
  check(typeof tc.function.parsed_arguments === 'object', `named #${seed}: parsed by the client`);
  cases.push({ schema: lookup, text: tc.function.arguments });
}

const responseFormat = { type: 'json_schema', json_schema: { name: 'story', schema: story, strict: true } };

async function schemaPlain(seed) {
  const r = await client.chat.completions.parse({ ...common, seed, response_format: responseFormat });
  const c = r.choices[0];
  check(c.finish_reason === 'stop', `schema #${seed}: finish_reason ${c.finish_reason}`);
  check(typeof c.message.parsed === 'object' && c.message.parsed !== null, `schema #${seed}: parsed`);
  cases.push({ schema: story, text: c.message.content });
}

async function schemaStream(seed) {
  const stream = client.chat.completions.stream({ ...common, seed, response_format: responseFormat });
  let content = '';
  for await (const chunk of stream) {
    for (const ch of chunk.choices) content += ch.delta.content ?? '';
  }
  const r = await stream.finalChatCompletion();
  const c = r.choices[0];
  check(c.finish_reason === 'stop', `schema stream #${seed}: finish_reason ${c.finish_reason}`);
  check(c.message.content === content, `schema stream #${seed}: final == deltas`);
  // (the client auto-parses streamed contents only for zod formats: JSON.parse here)
  let value = null;
  try { value = JSON.parse(content); } catch (e) { check(false, `schema stream #${seed}: ${e}`); }
  check(typeof value === 'object' && value !== null, `schema stream #${seed}: an object`);
  cases.push({ schema: story, text: content });
}

// Eight requests at a time: the server batches them.
for (const [name, fn] of [['required', requiredPlain], ['named stream', namedStream],
                          ['json_schema', schemaPlain], ['json_schema stream', schemaStream]]) {
  const before = cases.length;
  for (let s = 1; s <= N; s += 8) {
    const batch = [];
    for (let seed = s; seed < s + 8 && seed <= N; seed++) {
      batch.push(fn(seed).catch((e) => check(false, `${name} #${seed}: ${e}`)));
    }
    await Promise.all(batch);
  }
  check(cases.length - before === N, `${name}: ${cases.length - before} of ${N} texts`);
  console.log(`${name}: ${cases.length - before} of ${N} replies parsed by the client`);
}

// The independent judge.
const input = cases.map((c) => JSON.stringify(c)).join('\n') + '\n';
const out = spawnSync(validateJson, [], { input, encoding: 'utf8' });
check(out.status === 0, `validate-json ran (${out.stderr})`);
const verdicts = out.stdout.trim().split('\n');
const bad = verdicts.filter((v) => v !== 'ok');
check(verdicts.length === cases.length, `validate-json judged ${verdicts.length} of ${cases.length}`);
check(bad.length === 0, `validate-json: ${bad.length} bad: ${bad.slice(0, 3).join('; ')}`);
console.log(`validate-json: ${verdicts.length - bad.length} of ${cases.length} texts valid`);
if (failed) process.exit(1);
console.log('all tool-calling checks passed');
