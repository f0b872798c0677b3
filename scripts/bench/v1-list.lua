-- wrk script: v1 list of one registration's topic subscriptions (what a refresh does).
dofile("scripts/bench/common.lua")

request = function()
  n = n + 16
  return wrk.format("GET", "/v1/projects/" .. project .. "/registrations/" .. token_path(n % count)
    .. "/topicSubscriptions?pageSize=2000", {["Authorization"] = auth})
end
