-- ledger.lua: the grant ledger of an RLQS bucket's quota (decide.lua's mode 'grant'; `Store::grant`): a hash, one
-- field per holder (an Envoy's stream), 'held,want,until': what the holder was granted and has not reported used, how
-- many tokens it wants, and when the entry lapses (us, by the decision's clock), then ',n' for a newcomer (it has not
-- said its demand yet, and wants as much as any other). Every instance on one Redis reads and writes it in the same
-- atomic call that reads what the quota has left, so holdings never add up to more than that.

-- Max-min fair shares of `capacity` among holders wanting wants[i] (names[i] breaks ties): from the least wanting up,
-- each gets what it wants or an equal part, rounded down, of what is left, whichever is less (`store::fair_shares`).
local function fair_shares(capacity, names, wants)
  local order = {}
  for i = 1, #wants do order[i] = i end
  table.sort(order, function(x, y)
    if wants[x] ~= wants[y] then return wants[x] < wants[y] end
    return names[x] < names[y]
  end)
  local shares, left, n = {}, capacity, #wants
  for served, i in ipairs(order) do
    local equal = floor(left / (n - served + 1))
    local share = min(wants[i], equal)
    shares[i] = share
    left = left - share
  end
  return shares
end

-- The part of what is left only a newcomer may take (`store::RESERVE_PARTS`); the most a want weighs in the surplus.
local RESERVE_PARTS, WEIGHT_CAP = 25, 4294967296

-- What each holder is to hold of `pool`: its fair share, plus a part of what the shares leave in proportion to its
-- want, rounded down (`store::targets`).
local function targets(pool, names, wants)
  local shares = fair_shares(pool, names, wants)
  local given, weight = 0, 0
  for i = 1, #wants do
    given = given + shares[i]
    weight = weight + min(wants[i], WEIGHT_CAP)
  end
  local surplus = pool - given
  if surplus > 0 and weight > 0 then
    for i = 1, #wants do
      shares[i] = shares[i] + floor(surplus * min(wants[i], WEIGHT_CAP) / weight)
    end
  end
  return shares
end

-- `holder` of the ledger `lkey` holds `held` and wants `want` (0: it leaves); the quota has `left` left. `streams` > 0:
-- it has not said its demand yet, and that many streams are connected; `rate`: `left` is a rate's limit per window,
-- shared as rates. Returns { what it may hold now, its share, left, live holders, what they all hold, its entry }
-- (`store::allot`). The entry lasts `ttl` us, the key as long as its latest entry.
local function grant(lkey, now, left, holder, held, want, ttl, streams, rate)
  local newcomer = streams > 0
  local flat = redis.call('HGETALL', lkey)
  local names, wants, helds, news, stale = {}, {}, {}, {}, {}
  local others, latest, previous = 0, now + ttl, 0
  for i = 1, #flat, 2 do
    local name = flat[i]
    local h, w, u, new = string.match(flat[i + 1], '^(%d+),(%d+),(%d+)(,?n?)$')
    h, w, u = tonumber(h), tonumber(w), tonumber(u)
    if h == nil or u <= now then
      stale[#stale + 1] = name
    elseif name == holder then
      previous = h
    else
      local k = #names + 1
      names[k], wants[k], helds[k], news[k] = name, w, h, new == ',n'
      others = others + h
      if u > latest then latest = u end
    end
  end
  for _, name in ipairs(stale) do redis.call('HDEL', lkey, name) end
  if want == 0 then
    redis.call('HDEL', lkey, holder)
    return { 0, 0, left, #names, others, 0 }
  end
  -- A holder holds at most what its entry says it was granted.
  held = min(held, previous)
  local reserve = 0
  if not rate then reserve = floor(left / RESERVE_PARTS) end
  local n = #names + 1
  -- A newcomer's demand is not known yet (its entry says so): it wants as much as any other.
  local recorded, top = want, want
  for i = 1, #wants do top = max(top, wants[i]) end
  for i = 1, #wants do
    if news[i] then wants[i] = top end
  end
  if newcomer then want = top end
  names[n], wants[n], helds[n] = holder, want, held
  local shares = targets(left - reserve, names, wants)
  local share = shares[n]
  local free = max0(max0(left - others) - held)
  local open = free
  if not newcomer then open = max0(free - reserve) end
  local lacking = 0
  for i = 1, n - 1 do lacking = lacking + max0(shares[i] - helds[i]) end
  local amount = 0
  if left <= 0 then
    amount = 0
  elseif held < share then
    -- What is open is shared by all that lack, in proportion to what each lacks (at least a token while any is
    -- open): the first to ask does not take what the others wait for.
    local lack = share - held
    local part = floor(open * min(lack, WEIGHT_CAP) / min(lacking + lack, WEIGHT_CAP))
    amount = held + min(lack, max(part, min(open, 1)))
  else
    -- Down to its share at once: what it holds past that is the others' (its entry keeps it until it reports).
    amount = share
  end
  -- A lone newcomer's first grants of a budget stay within its part of what is left among the connected streams.
  if newcomer and not rate and n == 1 then amount = min(amount, max(held, floor(left / streams))) end
  -- Tokens of a budget handed out are not taken back before the holder reports them unspent.
  local entry = amount
  if not rate then entry = max(amount, held) end
  local mark = ''
  if newcomer then mark = ',n' end
  redis.call('HSET', lkey, holder, string.format('%d,%d,%d', entry, recorded, now + ttl) .. mark)
  redis.call('PEXPIRE', lkey, px(latest - now))
  return { amount, share, left, n, others + entry, entry }
end
