-- wrk script: v1 list of one registration's topic subscriptions (what a refresh does).
local project = os.getenv("BENCH_PROJECT")
local auth = "Bearer " .. os.getenv("BENCH_TOKEN")
local count = tonumber(os.getenv("BENCH_REGISTRATIONS"))
local threads = 0
local n = 0

function setup(thread)
  thread:set("offset", threads)
  threads = threads + 1
end

function init(args) n = offset end

request = function()
  n = n + 16
  local reg = string.format("b%07d%%3AAPA91b%s", n % count, string.rep("x", 140))
  return wrk.format("GET", "/v1/projects/" .. project .. "/registrations/" .. reg .. "/topicSubscriptions?pageSize=2000",
    {["Authorization"] = auth})
end
