-- Shared by the wrk scripts (loaded with dofile; wrk runs from the repository root).
-- Env: BENCH_PROJECT, BENCH_TOKEN (access token), BENCH_REGISTRATIONS (count registered by the bench).
project = os.getenv("BENCH_PROJECT")
auth = "Bearer " .. os.getenv("BENCH_TOKEN")
count = tonumber(os.getenv("BENCH_REGISTRATIONS"))
n = 0
local threads = 0

-- Each wrk thread starts at its own offset, so threads never send the same request.
function setup(thread)
  thread:set("offset", threads)
  threads = threads + 1
end

function init(args) n = offset end

-- Registration token number i, as the bench registered it.
function token(i)
  return string.format("b%07d:APA91b%s", i, string.rep("x", 140))
end

-- The same token as a URL path segment.
function token_path(i)
  return (token(i):gsub(":", "%%3A"))
end
