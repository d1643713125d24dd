-- Argo CD health check for evalkube.io/EvalRun (resource.customizations.health.evalkube.io_EvalRun).
-- Progressing while Pending/Running and while a Succeeded run's gate is still evaluating;
-- Healthy when Succeeded and its gate passed (or it has no gate); Degraded when Failed, or
-- Succeeded with a failed gate (the message names each failed check).
local hs = {status = "Progressing", message = "Waiting for the evalkube operator to pick up the run"}
if obj.status == nil or obj.status.phase == nil then
  return hs
end

local function condition(kind)
  if obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function failed_checks()
  local names = {}
  if obj.status.gate ~= nil and obj.status.gate.checks ~= nil then
    for _, check in ipairs(obj.status.gate.checks) do
      if check.passed == false then
        local text = tostring(check.name)
        if check.message ~= nil and check.message ~= "" then
          text = text .. ": " .. check.message
        end
        table.insert(names, text)
      end
    end
  end
  return names
end

local phase = obj.status.phase
if phase == "Pending" then
  hs.message = "Pending: the operator is preparing the run"
  return hs
end
if phase == "Running" then
  local units = obj.status.units
  if units ~= nil and units.total ~= nil then
    hs.message = string.format("Running: %d of %d units succeeded", units.succeeded or 0, units.total)
  else
    hs.message = "Running"
  end
  return hs
end
if phase == "Failed" then
  hs.status = "Degraded"
  local succeeded = condition("Succeeded")
  if succeeded ~= nil and succeeded.message ~= nil and succeeded.message ~= "" then
    hs.message = "Failed: " .. succeeded.message
  else
    hs.message = "Failed"
  end
  return hs
end
if phase == "Succeeded" then
  local passed = condition("Passed")
  if passed == nil or passed.reason == "NoGate" then
    hs.status = "Healthy"
    hs.message = obj.status.summary or "Succeeded"
    return hs
  end
  if passed.status == "True" then
    hs.status = "Healthy"
    hs.message = "Gate passed: " .. (passed.message or obj.status.summary or "")
    return hs
  end
  if passed.status == "False" then
    hs.status = "Degraded"
    local checks = failed_checks()
    if #checks > 0 then
      hs.message = "Gate failed: " .. table.concat(checks, "; ")
    else
      hs.message = "Gate failed: " .. (passed.message or passed.reason or "")
    end
    return hs
  end
  hs.message = "Succeeded; gate evaluating: " .. (passed.message or passed.reason or "")
  return hs
end
hs.status = "Unknown"
hs.message = "Unknown phase " .. tostring(phase)
return hs
