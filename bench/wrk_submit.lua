-- wrk script: single submits, each with its own Idempotency-Key (a new task every request).
-- Usage: ORBIT_TOKEN=... QUEUE=... wrk -t2 -c32 -d10s -s bench/wrk_submit.lua http://127.0.0.1:8080
local counter = 0
local prefix = ""

function setup(thread)
  thread:set("tid", tostring(math.random(1, 1e9)))
end

function init(args)
  prefix = tid or tostring(math.random(1, 1e9))
  wrk.method = "POST"
  wrk.path = "/v1/queues/" .. os.getenv("QUEUE") .. "/tasks"
  wrk.headers["Authorization"] = "Bearer " .. os.getenv("ORBIT_TOKEN")
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = '{"payload":{"n":1}}'
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = "wrk-" .. prefix .. "-" .. counter
  return wrk.format()
end

function done(summary, latency, requests)
  local codes = summary.errors.status
  io.write(string.format("non-2xx: %d\n", codes))
  io.write(string.format("p50_ms: %.2f p99_ms: %.2f\n", latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
