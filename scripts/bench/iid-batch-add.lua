-- wrk script: IID batchAdd with 1000 registration tokens a call, each call a new topic for its block.
dofile("scripts/bench/common.lua")
local blocks = {}

function init(args)
  n = offset
  for b = 0, math.floor(count / 1000) - 1 do
    local tokens = {}
    for i = 0, 999 do tokens[#tokens + 1] = '"' .. token(b * 1000 + i) .. '"' end
    blocks[#blocks + 1] = table.concat(tokens, ",")
  end
end

request = function()
  n = n + 16
  local block = blocks[(n % #blocks) + 1]
  local body = '{"to":"/topics/batch-' .. math.floor(n / #blocks) .. '","registration_tokens":[' .. block .. ']}'
  return wrk.format("POST", "/iid/v1:batchAdd",
    {["Authorization"] = auth, ["access_token_auth"] = "true", ["Content-Type"] = "application/json"}, body)
end
