// playground.js - the llmserve playground: a chat view (POST /v1/chat/completions)
// and a raw-completion view (POST /v1/completions), both streamed over SSE,
// the model and adapter picker from /v1/models, the sampling parameters, and
// a status panel from /metrics. Plain JavaScript, no library: it talks only
// to the server that served it (the page's Content-Security-Policy says so).
//
// Replies are rendered as a small Markdown subset by renderMarkdown(), which
// escapes every HTML character of the text FIRST and then adds only tags of
// its own, so model output can never become markup or script.
//
// For tests, each reply element carries data-state (streaming, done, stopped,
// error), data-raw (the text so far, set right after each chunk is shown),
// data-chunks (content chunks received) and data-model (the "model" the
// server answered with).
'use strict';

const KEY_STORE = 'llmserve.apiKey';

const $ = (id) => document.getElementById(id);

// ---- Markdown, a safe subset ----------------------------------------------------

function escapeHtml(s) {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;').replace(/'/g, '&#39;');
}

// Emphasis and links inside one line of escaped text that holds no code span.
// A link is made only for http(s) URLs; its text and URL are escaped already.
function renderEmphasis(s) {
  return s
    .replace(/\*\*(\S(?:[^*\n]*?\S)?)\*\*/g, '<strong>$1</strong>')
    .replace(/(^|[^\w*])\*(\S(?:[^*\n]*?\S)?)\*(?![\w*])/g, '$1<em>$2</em>')
    .replace(/(^|[^\w])_(\S(?:[^_\n]*?\S)?)_(?!\w)/g, '$1<em>$2</em>')
    .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s()]+)\)/g,
      '<a href="$2" rel="noopener noreferrer nofollow" target="_blank">$1</a>');
}

// One line of escaped text: `code` spans are kept verbatim, the rest gets emphasis.
function renderInline(s) {
  return s.split(/(`[^`\n]+`)/).map((part, i) =>
    i % 2 ? '<code>' + part.slice(1, -1) + '</code>' : renderEmphasis(part)).join('');
}

// Paragraphs (single newlines kept as <br>), # headings, - / * / + and 1.
// lists, > quotes, --- rules and ``` fenced code (an unclosed fence, as while a
// reply streams, runs to the end). Everything else is text.
function renderMarkdown(text) {
  const lines = escapeHtml(text).split('\n');
  const out = [];
  let para = [];
  let quote = [];
  let list = null;  // {tag: 'ul' | 'ol', start, items: [escaped line]}
  const flushPara = () => {
    if (para.length) out.push('<p>' + para.map(renderInline).join('<br>') + '</p>');
    para = [];
  };
  const flushQuote = () => {
    if (quote.length) out.push('<blockquote>' + quote.map(renderInline).join('<br>') + '</blockquote>');
    quote = [];
  };
  const flushList = () => {
    if (!list) return;
    const start = list.tag === 'ol' && list.start !== 1 ? ' start="' + list.start + '"' : '';
    out.push('<' + list.tag + start + '>' +
      list.items.map((it) => '<li>' + renderInline(it) + '</li>').join('') + '</' + list.tag + '>');
    list = null;
  };
  const flush = () => { flushPara(); flushQuote(); flushList(); };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m;
    if ((m = /^\s*```\s*([A-Za-z0-9_+#.-]*)/.exec(line))) {
      flush();
      const code = [];
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
      const cls = m[1] ? ' class="lang-' + m[1] + '"' : '';
      out.push('<pre><code' + cls + '>' + code.join('\n') + '</code></pre>');
    } else if (/^\s*$/.test(line)) {
      flush();
    } else if ((m = /^(#{1,6})\s+(.*?)(\s+#+)?\s*$/.exec(line))) {
      flush();
      out.push('<h' + m[1].length + '>' + renderInline(m[2]) + '</h' + m[1].length + '>');
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      out.push('<hr>');
    } else if ((m = /^\s*[-*+]\s+(.*)$/.exec(line))) {
      flushPara(); flushQuote();
      if (!list || list.tag !== 'ul') { flushList(); list = { tag: 'ul', start: 1, items: [] }; }
      list.items.push(m[1]);
    } else if ((m = /^\s*(\d{1,9})[.)]\s+(.*)$/.exec(line))) {
      flushPara(); flushQuote();
      if (!list || list.tag !== 'ol') { flushList(); list = { tag: 'ol', start: Number(m[1]), items: [] }; }
      list.items.push(m[2]);
    } else if ((m = /^\s*&gt;\s?(.*)$/.exec(line))) {
      flushPara(); flushList();
      quote.push(m[1]);
    } else if (list && /^\s+\S/.test(line)) {
      list.items[list.items.length - 1] += ' ' + line.trim();
    } else {
      flushQuote(); flushList();
      para.push(line);
    }
  }
  flush();
  return out.join('');
}

// ---- talking to the server --------------------------------------------------------

const state = {
  key: localStorage.getItem(KEY_STORE) || '',
  messages: [],     // the conversation sent with each chat request: {role, content}
  busy: null,       // the AbortController of the request in flight
};

function apiHeaders() {
  const h = { 'Content-Type': 'application/json' };
  if (state.key) h.Authorization = 'Bearer ' + state.key;
  return h;
}

// The error of a failed response, as the server words it (OpenAI's shape).
async function errorMessage(resp) {
  const text = await resp.text();
  try {
    const j = JSON.parse(text);
    if (j && j.error && typeof j.error.message === 'string') return j.error.message;
  } catch (e) { /* not JSON: show the text */ }
  return text || resp.statusText || 'request failed';
}

// The "data:" payloads of an SSE response body, as they arrive.
async function* sseData(resp) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = event.split('\n').filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (data) yield data;  // comment-only events (": keep-alive") have none
    }
  }
}

// The figures shown under a reply. TTFT: request sent -> first content chunk.
// tok/s: the tokens after the first over the time since the first (decode
// speed as this browser saw it). While streaming, tokens are counted as
// content chunks; the usage chunk at the end gives the server's exact count.
function metaText(s) {
  const parts = [];
  if (s.tFirst) parts.push('TTFT ' + Math.round(s.tFirst - s.t0) + ' ms');
  const n = s.tokens != null ? s.tokens : s.chunks;
  const dt = (s.tLast - s.tFirst) / 1000;
  if (n > 1 && dt > 0.001) parts.push(((n - 1) / dt).toFixed(1) + ' tok/s');
  if (n) parts.push(n + (s.tokens != null ? ' tokens' : ' chunks'));
  if (s.finish) parts.push(s.finish);
  if (s.model) parts.push(s.model);
  return parts.join(' · ');
}

// POSTs body to route and streams the reply into el (its .body and .meta
// children). pieceOf(chunk) is the new text of a chunk. render(text) fills
// .body. Resolves to {ok, text}.
async function runStream(route, body, el, pieceOf, render) {
  const ctrl = new AbortController();
  setBusy(ctrl);
  const bodyEl = el.querySelector('.body');
  const metaEl = el.querySelector('.meta');
  const s = { t0: performance.now(), tFirst: 0, tLast: 0, chunks: 0, tokens: null,
              finish: null, model: null, text: '' };
  const fail = (msg) => {
    el.classList.add('error');
    el.dataset.state = 'error';
    el.dataset.error = msg;
    metaEl.textContent = msg;
  };
  el.dataset.state = 'streaming';
  $('last-request-body').textContent = 'POST ' + route + '\n' + JSON.stringify(body, null, 2);
  try {
    const resp = await fetch(route, { method: 'POST', headers: apiHeaders(),
                                      body: JSON.stringify(body), signal: ctrl.signal });
    if (!resp.ok) {
      const msg = await errorMessage(resp);
      fail('HTTP ' + resp.status + ': ' + msg);
      if (resp.status === 401) askKey(msg);
      return { ok: false, text: '' };
    }
    for await (const data of sseData(resp)) {
      if (data === '[DONE]') break;
      const chunk = JSON.parse(data);
      if (chunk.error) {  // an error after the stream began (a timeout)
        fail(chunk.error.message || 'stream failed');
        return { ok: false, text: s.text };
      }
      if (chunk.model) s.model = chunk.model;
      if (chunk.usage) s.tokens = chunk.usage.completion_tokens;
      const c = chunk.choices && chunk.choices[0];
      if (c) {
        const piece = pieceOf(c);
        if (piece) {
          const now = performance.now();
          if (!s.tFirst) s.tFirst = now;
          s.tLast = now;
          s.chunks++;
          s.text += piece;
          render(bodyEl, s.text);
          el.dataset.raw = s.text;
          el.dataset.chunks = String(s.chunks);
        }
        if (c.finish_reason) s.finish = c.finish_reason;
      }
      if (s.model) el.dataset.model = s.model;
      metaEl.textContent = metaText(s);
    }
    el.dataset.state = 'done';
    metaEl.textContent = metaText(s);
    return { ok: true, text: s.text };
  } catch (e) {
    if (ctrl.signal.aborted) {
      el.dataset.raw = s.text;
      el.dataset.state = 'stopped';
      metaEl.textContent = metaText(s) + (s.text ? ' · ' : '') + 'stopped';
      return { ok: true, text: s.text };
    }
    fail(e instanceof SyntaxError ? 'bad chunk from the server: ' + e.message
                                  : 'cannot reach the server: ' + e.message);
    return { ok: false, text: s.text };
  } finally {
    setBusy(null);
  }
}

function setBusy(ctrl) {
  state.busy = ctrl;
  for (const id of ['chat-send', 'complete-send']) $(id).disabled = !!ctrl;
  for (const id of ['chat-stop', 'complete-stop']) $(id).disabled = !ctrl;
}

function stop() {
  if (state.busy) state.busy.abort();
}

// ---- the request's fields -------------------------------------------------------------

// The sampling fields whose value differs from the API's default (data-default):
// what is left out, the server fills in. Values go as typed; the server checks them.
function samplingFields() {
  const out = {};
  for (const inp of $('params').querySelectorAll('input[name]')) {
    if (inp.type === 'checkbox') {
      if (inp.checked) out[inp.name] = true;
      continue;
    }
    const v = inp.value.trim();
    if (v === '' || v === inp.dataset.default) continue;
    if (inp.name === 'stop') {
      out.stop = v.split(',').map((x) => x.replace(/\\n/g, '\n').replace(/\\t/g, '\t'))
        .filter((x) => x.length);
      continue;
    }
    const num = Number(v);
    out[inp.name] = Number.isFinite(num) ? num : v;
  }
  return out;
}

function modelField() {
  const m = $('model').value;
  return m ? { model: m } : {};
}

function streamFields() {
  return { stream: true, stream_options: { include_usage: true } };
}

// ---- chat -------------------------------------------------------------------------------

function addMessage(role, text) {
  const el = document.createElement('div');
  el.className = 'msg ' + role;
  const who = document.createElement('div');
  who.className = 'who';
  who.textContent = role;
  const body = document.createElement('div');
  body.className = 'body';
  if (role === 'user') body.textContent = text;
  const meta = document.createElement('div');
  meta.className = 'meta';
  el.append(who, body, meta);
  $('messages').append(el);
  el.scrollIntoView({ block: 'end' });
  return el;
}

async function sendChat() {
  const input = $('chat-input');
  const text = input.value;
  if (!text.trim() || state.busy) return;
  input.value = '';
  const userEl = addMessage('user', text);
  state.messages.push({ role: 'user', content: text });
  const messages = [];
  const system = $('system').value;
  if (system.trim()) messages.push({ role: 'system', content: system });
  messages.push(...state.messages);
  const body = { ...modelField(), messages, ...samplingFields(), ...streamFields() };
  const el = addMessage('assistant', '');
  const r = await runStream('/v1/chat/completions', body, el,
    (c) => c.delta && c.delta.content,
    (bodyEl, t) => { bodyEl.innerHTML = renderMarkdown(t); el.scrollIntoView({ block: 'end' }); });
  if (r.ok) {
    state.messages.push({ role: 'assistant', content: r.text });
  } else {
    // The failed turn leaves the conversation; its text goes back to the input.
    state.messages.pop();
    userEl.classList.add('failed');
    if (!input.value) input.value = text;
  }
}

function clearChat() {
  if (state.busy) return;
  state.messages = [];
  $('messages').replaceChildren();
}

// ---- raw completion -----------------------------------------------------------------------

async function sendCompletion() {
  if (state.busy) return;
  const prompt = $('prompt').value;
  const el = $('completion');
  el.classList.remove('error');
  el.replaceChildren();
  const pre = document.createElement('pre');
  const echo = document.createElement('span');
  echo.className = 'prompt-echo';
  echo.textContent = prompt;
  const out = document.createElement('span');
  out.className = 'body';
  pre.append(echo, out);
  const meta = document.createElement('div');
  meta.className = 'meta';
  el.append(pre, meta);
  const body = { ...modelField(), prompt, ...samplingFields(), ...streamFields() };
  await runStream('/v1/completions', body, el, (c) => c.text,
    (bodyEl, t) => { bodyEl.textContent = t; });
}

// ---- models and the API key -----------------------------------------------------------------

async function loadModels() {
  let resp;
  try {
    resp = await fetch('/v1/models', { headers: apiHeaders() });
  } catch (e) {
    setModelsError('cannot reach the server');
    return;
  }
  if (resp.status === 401) {
    const msg = await errorMessage(resp);
    setModelsError('API key needed');
    askKey(msg);
    return;
  }
  if (!resp.ok) {
    setModelsError('HTTP ' + resp.status + ': ' + await errorMessage(resp));
    return;
  }
  const list = await resp.json();
  const sel = $('model');
  const keep = sel.value;
  sel.replaceChildren();
  for (const m of list.data || []) {
    const o = document.createElement('option');
    o.value = m.id;
    o.textContent = m.parent ? m.id + ' (adapter of ' + m.parent + ')' : m.id;
    sel.append(o);
  }
  if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
  sel.title = 'max_model_len ' + ((list.data && list.data[0] && list.data[0].max_model_len) || '?');
  document.body.dataset.models = 'loaded';
}

function setModelsError(msg) {
  const sel = $('model');
  sel.replaceChildren();
  const o = document.createElement('option');
  o.value = '';
  o.textContent = msg;
  sel.append(o);
}

function askKey(reason) {
  const dlg = $('key-dialog');
  if (reason) $('key-reason').textContent = reason + '. The key is kept in this browser ' +
    '(localStorage) and sent as "Authorization: Bearer KEY".';
  $('key-input').value = state.key;
  if (!dlg.open) dlg.showModal();
  $('key-input').focus();
}

function keyAction(action) {
  const dlg = $('key-dialog');
  if (action === 'save') {
    state.key = $('key-input').value.trim();
    if (state.key) localStorage.setItem(KEY_STORE, state.key);
    else localStorage.removeItem(KEY_STORE);
  } else if (action === 'forget') {
    state.key = '';
    localStorage.removeItem(KEY_STORE);
  }
  dlg.close();
  if (action !== 'cancel') loadModels();
}

// ---- the status panel -------------------------------------------------------------------------

const SPARK_POINTS = 60;  // one a second: the last minute
const status = { prev: null, tps: [] };

function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const m = /^([A-Za-z_:][\w:]*)\s+(\S+)$/.exec(line);  // unlabelled samples only
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

function drawSpark() {
  const v = status.tps;
  const max = Math.max(1, ...v);
  const step = 240 / (SPARK_POINTS - 1);
  const x0 = (SPARK_POINTS - v.length) * step;
  $('st-spark-line').setAttribute('points',
    v.map((y, i) => (x0 + i * step).toFixed(1) + ',' + (47 - 45 * y / max).toFixed(1)).join(' '));
  $('st-tps-max').textContent = v.length ? Math.max(...v).toFixed(1) : '–';
}

async function pollMetrics() {
  try {
    const resp = await fetch('/metrics', { cache: 'no-store' });
    if (!resp.ok) throw new Error('HTTP ' + resp.status);
    const m = parseMetrics(await resp.text());
    const now = performance.now();
    $('st-conn').textContent = 'up';
    $('st-conn').classList.remove('down');
    $('st-running').textContent = m.llmserve_requests_running;
    $('st-waiting').textContent = m.llmserve_requests_waiting;
    const used = m.llmserve_kv_blocks_used;
    const total = m.llmserve_kv_blocks_total;
    $('st-kv').textContent = used + ' / ' + total;
    $('st-cached').textContent = m.llmserve_kv_blocks_cached;
    $('st-kv-bar').style.width = (total ? 100 * used / total : 0).toFixed(1) + '%';
    const prompt = m.llmserve_prompt_tokens_total;
    $('st-hit').textContent = prompt
      ? (100 * m.llmserve_prefix_cache_hit_tokens_total / prompt).toFixed(1) + '%' : '–';
    const gen = m.llmserve_generation_tokens_total;
    const p = status.prev;
    if (p) {
      // A restarted server counts from 0 again: no negative rate.
      const tps = Math.max(0, gen - p.gen) / ((now - p.t) / 1000);
      status.tps.push(tps);
      if (status.tps.length > SPARK_POINTS) status.tps.shift();
      $('st-tps').textContent = tps.toFixed(1);
      drawSpark();
    }
    status.prev = { t: now, gen };
  } catch (e) {
    $('st-conn').textContent = 'unreachable';
    $('st-conn').classList.add('down');
  }
  setTimeout(pollMetrics, 1000);
}

// ---- wiring -------------------------------------------------------------------------------------

function showView(name) {
  $('chat-view').hidden = name !== 'chat';
  $('complete-view').hidden = name !== 'complete';
  $('tab-chat').setAttribute('aria-pressed', String(name === 'chat'));
  $('tab-complete').setAttribute('aria-pressed', String(name === 'complete'));
}

function init() {
  $('tab-chat').addEventListener('click', () => showView('chat'));
  $('tab-complete').addEventListener('click', () => showView('complete'));
  $('chat-form').addEventListener('submit', (e) => { e.preventDefault(); sendChat(); });
  $('chat-input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); sendChat(); }
  });
  $('chat-stop').addEventListener('click', stop);
  $('chat-clear').addEventListener('click', clearChat);
  $('complete-form').addEventListener('submit', (e) => { e.preventDefault(); sendCompletion(); });
  $('complete-stop').addEventListener('click', stop);
  $('params').addEventListener('submit', (e) => e.preventDefault());
  $('key-button').addEventListener('click', () => askKey(''));
  $('key-form').addEventListener('submit', (e) => {
    e.preventDefault();
    keyAction(e.submitter ? e.submitter.value : 'save');
  });
  setBusy(null);
  loadModels();
  pollMetrics();
}

init();
