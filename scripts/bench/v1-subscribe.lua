-- wrk script: v1 topic subscription creates, each a new (registration, topic) pair.
dofile("scripts/bench/common.lua")

request = function()
  n = n + 16
  local path = "/v1/projects/" .. project .. "/registrations/" .. token_path(n % count)
    .. "/topicSubscriptions?topic_name=bench-" .. math.floor(n / count)
  return wrk.format("POST", path, {["Authorization"] = auth, ["Content-Type"] = "application/json"}, "{}")
end
