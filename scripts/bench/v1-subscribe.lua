-- wrk script: v1 topic subscription creates, each a new (registration, topic) pair.
-- Env: BENCH_PROJECT, BENCH_TOKEN (access token), BENCH_REGISTRATIONS (count registered by the bench).
local project = os.getenv("BENCH_PROJECT")
local auth = "Bearer " .. os.getenv("BENCH_TOKEN")
local count = tonumber(os.getenv("BENCH_REGISTRATIONS"))
local threads = 0
local n = 0
local stride = 1

function setup(thread)
  thread:set("offset", threads)
  threads = threads + 1
end

function init(args)
  n = offset
  stride = 16
end

local function token(i)
  return string.format("b%07d%%3AAPA91b%s", i, string.rep("x", 140))
end

request = function()
  n = n + stride
  local reg = token(n % count)
  local topic = "bench-" .. math.floor(n / count)
  local path = "/v1/projects/" .. project .. "/registrations/" .. reg .. "/topicSubscriptions?topic_name=" .. topic
  return wrk.format("POST", path, {["Authorization"] = auth, ["Content-Type"] = "application/json"}, "{}")
end

local statuses = {}
response = function(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
