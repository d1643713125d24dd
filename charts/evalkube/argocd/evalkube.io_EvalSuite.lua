-- Argo CD health check for evalkube.io/EvalSuite (resource.customizations.health.evalkube.io_EvalSuite).
-- The operator checks a suite (templates, graders, datasets) on every spec change: Healthy
-- when Ready, Degraded when Invalid (the message lists the problems), Progressing until the
-- operator has checked the current generation.
local hs = {status = "Progressing", message = "Waiting for the evalkube operator to check the suite"}
if obj.status == nil or obj.status.phase == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.message = string.format("Waiting for the operator to check generation %d (checked %d)", generation, observed)
  return hs
end

local ready = nil
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Ready" then
      ready = c
    end
  end
end
local message = ""
if ready ~= nil and ready.message ~= nil then
  message = ready.message
end

if obj.status.phase == "Ready" then
  hs.status = "Healthy"
  hs.message = "Ready: " .. message
  return hs
end
if obj.status.phase == "Invalid" then
  hs.status = "Degraded"
  hs.message = "Invalid: " .. message
  return hs
end
hs.status = "Unknown"
hs.message = "Unknown phase " .. tostring(obj.status.phase)
return hs
