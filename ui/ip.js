// Addresses, subnets and IPPool ranges for the address map: IPv4 and IPv6 as BigInt, and a
// range read exactly as the service's IPAM reads it (src/ipam/range.rs, after Harvester's
// MakeRange): the defaults from the subnet, reversed bounds swapped, a default gateway.
// Pure functions only (tests/ui/model.test.mjs runs them under node).

/** Pools whose subnet (or, failing that, range) has at most this many addresses get one map
 * cell per address; larger ones are summarised. A /22. */
export const MAP_LIMIT = 1024n;

/** Cells per row of the map (an IPv4 row then starts at a multiple of 16). */
export const ROW = 16n;

function parseV4(text) {
  const parts = text.split('.');
  if (parts.length !== 4) return null;
  let value = 0n;
  for (const part of parts) {
    if (!/^\d{1,3}$/.test(part) || Number(part) > 255) return null;
    value = (value << 8n) | BigInt(part);
  }
  return value;
}

function parseV6(text) {
  if (!/^[0-9a-fA-F:.]+$/.test(text) || text.split('::').length > 2) return null;
  let tail = [];
  let v4 = null;
  // An IPv4 tail (::ffff:10.0.0.1) is the last two groups.
  const lastColon = text.lastIndexOf(':');
  if (text.slice(lastColon + 1).includes('.')) {
    v4 = parseV4(text.slice(lastColon + 1));
    if (v4 === null) return null;
    text = text.slice(0, lastColon + 1) + '0:0';
  }
  const [head, rest] = text.split('::');
  const groups = (s) => (s === '' ? [] : s.split(':'));
  const front = groups(head);
  tail = rest === undefined ? [] : groups(rest);
  const missing = 8 - front.length - tail.length;
  if (rest === undefined ? missing !== 0 : missing < 1) return null;
  const all = [...front, ...Array(rest === undefined ? 0 : missing).fill('0'), ...tail];
  let value = 0n;
  for (const g of all) {
    if (!/^[0-9a-fA-F]{1,4}$/.test(g)) return null;
    value = (value << 16n) | BigInt('0x' + g);
  }
  if (v4 !== null) value = (value & ~0xffffffffn) | v4;
  return value;
}

/** `{family: 4|6, value: BigInt}`, or null when `text` is not an address. */
export function parseIp(text) {
  if (typeof text !== 'string' || text === '') return null;
  if (text.includes(':')) {
    const value = parseV6(text);
    return value === null ? null : { family: 6, value };
  }
  const value = parseV4(text);
  return value === null ? null : { family: 4, value };
}

/** The address as text: dotted IPv4, or RFC 5952 IPv6 (as the service writes it). */
export function formatIp(family, value) {
  if (family === 4) {
    return [24n, 16n, 8n, 0n].map((s) => String((value >> s) & 255n)).join('.');
  }
  const groups = [];
  for (let s = 112n; s >= 0n; s -= 16n) groups.push(Number((value >> s) & 0xffffn));
  // The longest run of two or more zero groups becomes `::` (the first such run on a tie).
  let best = { at: -1, len: 1 };
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > best.len) best = { at: i, len: j - i };
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (best.at < 0) return hex.join(':');
  return hex.slice(0, best.at).join(':') + '::' + hex.slice(best.at + best.len).join(':');
}

/** A subnet `a.b.c.d/n`, its host bits cleared: `{family, bits, prefix, network, last, size}`. */
export function parseCidr(text) {
  if (typeof text !== 'string') return null;
  const slash = text.indexOf('/');
  if (slash < 0) return null;
  const ip = parseIp(text.slice(0, slash));
  const prefixText = text.slice(slash + 1);
  if (!ip || !/^\d{1,3}$/.test(prefixText)) return null;
  const bits = ip.family === 4 ? 32n : 128n;
  const prefix = BigInt(prefixText);
  if (prefix > bits) return null;
  const size = 1n << (bits - prefix);
  const network = ip.value & ~(size - 1n);
  return { family: ip.family, bits, prefix, network, last: network + size - 1n, size };
}

/** One pool range as the IPAM reads it: `{subnet, start, end, gateway}` (gateway null when a
 * point subnet has none), or `{error}` when the spec is not a valid range. */
export function readRange(spec) {
  const subnet = parseCidr(spec?.subnet ?? '');
  if (!subnet) return { error: `invalid subnet ${JSON.stringify(spec?.subnet ?? '')}` };
  const point = subnet.size === 1n;
  const first = point ? subnet.network : subnet.network + 1n;
  const last = point ? subnet.network : subnet.family === 4 ? subnet.last - 1n : subnet.last;
  const bound = (text, fallback) => {
    if (!text) return fallback;
    const ip = parseIp(text);
    if (!ip || ip.family !== subnet.family || ip.value < subnet.network || ip.value > subnet.last) {
      return undefined;
    }
    return ip.value;
  };
  let start = bound(spec.rangeStart, first);
  let end = bound(spec.rangeEnd, last);
  const gateway = bound(spec.gateway, point ? null : first);
  if (start === undefined || end === undefined || gateway === undefined) {
    return { error: `invalid range in ${spec.subnet}` };
  }
  if (start > end) [start, end] = [end, start];
  return { subnet, start, end, gateway };
}

/** Addresses a range hands out: its length less the gateway when it lies inside. */
export function rangeSize(range) {
  const inside = range.gateway !== null && range.gateway >= range.start && range.gateway <= range.end;
  return range.end - range.start + 1n - (inside ? 1n : 0n);
}

/** A status map (`allocated`, `allocatedHistory`: address → holder) keyed by the address's
 * value, so lookups do not depend on how an address is spelled. */
export function indexByValue(family, map) {
  const out = new Map();
  for (const [text, holder] of Object.entries(map ?? {})) {
    const ip = parseIp(text);
    if (ip && ip.family === family) out.set(ip.value, holder);
  }
  return out;
}

/**
 * What one address of a range is: `allocated` (held by a load balancer), `gateway`, `excluded`
 * (in the subnet but not handed out: outside the range, the network or broadcast address),
 * `history` (free, remembered for its last holder, which gets it back first) or `free`.
 */
export function cellState(range, value, allocated, history) {
  if (allocated.has(value)) return 'allocated';
  if (range.gateway !== null && value === range.gateway) return 'gateway';
  if (value < range.start || value > range.end) return 'excluded';
  if (history.has(value)) return 'history';
  return 'free';
}

/** Why an excluded address is never handed out. */
export function excludedWhy(range, value) {
  const { subnet } = range;
  if (subnet.size > 1n && value === subnet.network) return 'the network address';
  if (subnet.family === 4 && subnet.size > 2n && value === subnet.last) return 'the broadcast address';
  return `outside the range ${formatIp(subnet.family, range.start)}–${formatIp(subnet.family, range.end)}`;
}

/**
 * How to draw a range: `{kind: 'grid', from, to}` (one cell per address from `from` to `to`:
 * the whole subnet when it has at most MAP_LIMIT addresses, else the range itself widened to
 * whole rows), or `{kind: 'summary'}` beyond.
 */
export function mapPlan(range) {
  const { subnet } = range;
  if (subnet.size <= MAP_LIMIT) return { kind: 'grid', from: subnet.network, to: subnet.last };
  const from = range.start - (range.start % ROW);
  let to = range.end - (range.end % ROW) + ROW - 1n;
  if (to > subnet.last) to = subnet.last;
  if (to - from + 1n <= MAP_LIMIT) return { kind: 'grid', from, to };
  return { kind: 'summary' };
}

/** The entries of an index (value → holder) that fall inside `[from, to]`, in address order. */
export function entriesWithin(index, from, to) {
  return [...index.entries()]
    .filter(([v]) => v >= from && v <= to)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}
