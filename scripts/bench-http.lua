-- bench-http.lua: wrk posts non-streaming /v1/completions, each with a fresh
-- random prompt of 16 token ids (so the prefix cache does not help), greedy,
-- ignore_eos, max_tokens from the MAX_TOKENS environment variable (32).
-- With ROUTE=tokenize it posts a short text to /tokenize instead (the HTTP
-- and JSON layer alone, no engine step).
local route = os.getenv("ROUTE") or "completions"
local max_tokens = tonumber(os.getenv("MAX_TOKENS") or "32")
local n_vocab = tonumber(os.getenv("N_VOCAB") or "32000")
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("seed", counter)
end

function init(args)
  math.randomseed(seed or 1)
end

function request()
  if route == "tokenize" then
    return wrk.format("POST", "/tokenize", {["Content-Type"] = "application/json"},
      '{"prompt":"Hello world, how are you today?"}')
  end
  local ids = {}
  for i = 1, 16 do ids[i] = math.random(3, n_vocab - 1) end
  local body = string.format(
    '{"prompt":[%s],"max_tokens":%d,"temperature":0,"ignore_eos":true}',
    table.concat(ids, ","), max_tokens)
  return wrk.format("POST", "/v1/completions", {["Content-Type"] = "application/json"}, body)
end

function done(summary, latency, requests)
  io.write(string.format("wrk: requests=%d non2xx=%d duration_s=%.3f lat_p50_ms=%.3f "
    .. "lat_p99_ms=%.3f lat_mean_ms=%.3f\n",
    summary.requests, summary.errors.status, summary.duration / 1e6,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, latency.mean / 1e3))
end
