-- wrk script: IID batchAdd with 1000 registration tokens a call, each call a new topic for its block.
local auth = "Bearer " .. os.getenv("BENCH_TOKEN")
local count = tonumber(os.getenv("BENCH_REGISTRATIONS"))
local blocks = {}
local threads = 0
local n = 0

function setup(thread)
  thread:set("offset", threads)
  threads = threads + 1
end

function init(args)
  n = offset
  for b = 0, math.floor(count / 1000) - 1 do
    local tokens = {}
    for i = 0, 999 do
      tokens[#tokens + 1] = string.format('"b%07d:APA91b%s"', b * 1000 + i, string.rep("x", 140))
    end
    blocks[#blocks + 1] = table.concat(tokens, ",")
  end
end

request = function()
  n = n + 16
  local block = blocks[(n % #blocks) + 1]
  local topic = "batch-" .. math.floor(n / #blocks)
  local body = '{"to":"/topics/' .. topic .. '","registration_tokens":[' .. block .. ']}'
  return wrk.format("POST", "/iid/v1:batchAdd",
    {["Authorization"] = auth, ["access_token_auth"] = "true", ["Content-Type"] = "application/json"}, body)
end
