// What the console shows, derived from the API's objects: a load balancer's state and why it is
// not Ready, its address and pool, the guest cluster and Service behind it, the owner of a pool
// address, a pool's usage, and the guest clusters that have load balancers. Pure functions only
// (tests/ui/model.test.mjs runs them under node).

import {
  cellState, excludedWhy, formatIp, indexByValue, parseIp, rangeSize, readRange,
} from './ip.js';

/** Labels the guest-cluster load balancing puts on a guest Service's LoadBalancer. */
export const LABEL_CLUSTER = 'cloudprovider.harvesterhci.io/cluster';
export const LABEL_SERVICE_NAMESPACE = 'cloudprovider.harvesterhci.io/serviceNamespace';
export const LABEL_SERVICE_NAME = 'cloudprovider.harvesterhci.io/serviceName';
/** Annotations of a guest Service. */
export const SVC_IPAM = 'cloudprovider.harvesterhci.io/ipam';
export const SVC_PRIMARY = 'cloudprovider.harvesterhci.io/primary-service';
export const KUBE_VIP_IPS = 'kube-vip.io/loadbalancerIPs';
export const DHCP_ADDRESS = '0.0.0.0';

export const STATES = [
  { value: 'ready', label: 'Ready' },
  { value: 'not-ready', label: 'Not ready' },
  { value: 'pending', label: 'Pending' },
  { value: 'deleting', label: 'Deleting' },
];

export function idOf(obj) {
  const m = obj?.metadata ?? {};
  return m.namespace ? `${m.namespace}/${m.name}` : (m.name ?? '');
}

export function readyCondition(obj) {
  return (obj?.status?.conditions ?? []).find((c) => c.type === 'Ready') ?? null;
}

/**
 * `{state, label, why}`: `deleting` (its finalizer still has to release the address),
 * `ready`, `not-ready` (the Ready condition's message says why) or `pending` (the reconciler
 * has not reported on it yet). `why` is null when it is Ready.
 */
export function lbState(lb) {
  const ready = readyCondition(lb);
  if (lb?.metadata?.deletionTimestamp) {
    return {
      state: 'deleting', label: 'Deleting',
      why: 'Being deleted: the reconciler releases its address, then the object goes.',
    };
  }
  if (ready?.status === 'True') return { state: 'ready', label: 'Ready', why: null };
  if (ready) {
    return {
      state: 'not-ready', label: 'Not ready',
      why: ready.message || ready.reason || `Ready is ${ready.status}, with no message.`,
    };
  }
  return {
    state: 'pending', label: 'Pending',
    why: 'The reconciler has not reported on it yet (no Ready condition).',
  };
}

/** `{address, dhcp}`: the address it serves (for DHCP, the lease once reported), or ''. */
export function lbAddress(lb) {
  const dhcp = lb?.spec?.ipam === 'dhcp';
  const status = lb?.status ?? {};
  const reported = status.address && status.address !== DHCP_ADDRESS ? status.address : '';
  if (reported) return { address: reported, dhcp };
  if (dhcp) return { address: '', dhcp };
  return { address: status.allocatedAddress?.ip ?? '', dhcp };
}

/** The pool it holds its address from, else the one it asks for, else ''. */
export function lbPool(lb) {
  return lb?.status?.allocatedAddress?.ipPool || lb?.spec?.ipPool || '';
}

/** The guest cluster and Service behind a guest load balancer, or null for others. */
export function guestOf(lb) {
  const labels = lb?.metadata?.labels ?? {};
  const cluster = labels[LABEL_CLUSTER];
  if (!cluster) return null;
  return {
    namespace: lb.metadata.namespace,
    cluster,
    serviceNamespace: labels[LABEL_SERVICE_NAMESPACE] ?? '',
    serviceName: labels[LABEL_SERVICE_NAME] ?? '',
  };
}

/** Whether `name` can name a guest cluster or its namespace: an RFC 1123 label, as the API
 * requires (it answers 422 for anything else). */
export function isGuestClusterName(name) {
  return typeof name === 'string' && name.length <= 63 && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(name);
}

/** The guest clusters that have load balancers, as `{namespace, cluster}`, sorted. A label that
 * cannot name a guest cluster makes no cluster: see `brokenGuestLbs`. */
export function guestClusters(lbs) {
  const seen = new Map();
  for (const lb of lbs) {
    const g = guestOf(lb);
    if (g && isGuestClusterName(g.cluster) && isGuestClusterName(g.namespace)) {
      seen.set(`${g.namespace}/${g.cluster}`, { namespace: g.namespace, cluster: g.cluster });
    }
  }
  return [...seen.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([, v]) => v);
}

/** Load balancers labelled with a guest cluster that no guest cluster can be (the label is not
 * an RFC 1123 label), as `{lb, cluster}`, sorted by id: each is one broken object, not a cluster
 * to ask the API about. */
export function brokenGuestLbs(lbs) {
  return lbs
    .map((lb) => ({ lb, g: guestOf(lb) }))
    .filter(({ g }) => g && !(isGuestClusterName(g.cluster) && isGuestClusterName(g.namespace)))
    .map(({ lb, g }) => ({ lb, cluster: g.cluster }))
    .sort((a, b) => idOf(a.lb).localeCompare(idOf(b.lb)));
}

/** How often the page shown is refreshed while its requests succeed. */
export const POLL_MS = 2000;
/** The longest wait between two tries of a failing request. */
export const BACKOFF_MAX_MS = 60_000;

/** The wait before the next try after `failures` failures in a row: POLL_MS after a success,
 * then doubling from POLL_MS (2 s, 4 s, 8 s…) up to BACKOFF_MAX_MS. */
export function retryDelay(failures) {
  if (failures <= 0) return POLL_MS;
  return Math.min(POLL_MS * 2 ** Math.min(failures - 1, 16), BACKOFF_MAX_MS);
}

/** Load balancers matching the filters (`''` matches anything); `text` searches the id and
 * the address. */
export function filterLbs(lbs, { namespace = '', pool = '', state = '', text = '' } = {}) {
  const needle = text.trim().toLowerCase();
  return lbs.filter((lb) => {
    if (namespace && lb.metadata?.namespace !== namespace) return false;
    if (pool && lbPool(lb) !== pool) return false;
    if (state && lbState(lb).state !== state) return false;
    if (needle) {
      const hay = `${idOf(lb)} ${lbAddress(lb).address}`.toLowerCase();
      if (!hay.includes(needle)) return false;
    }
    return true;
  });
}

/** A pool's ranges as the IPAM reads them, each with its address family's status indexes. */
export function poolRanges(pool) {
  const status = pool?.status ?? {};
  return (pool?.spec?.ranges ?? []).map((spec) => {
    const range = readRange(spec);
    if (range.error) return { spec, error: range.error };
    const family = range.subnet.family;
    return {
      spec,
      range,
      allocated: indexByValue(family, status.allocated),
      history: indexByValue(family, status.allocatedHistory),
    };
  });
}

/**
 * A pool's usage for its bar: `{total, allocated, history, free, reported}`. `total` and the
 * allocated count come from the reconciler's status (`total`, `available`); history counts the
 * remembered addresses that are free again. `reported` is false before the first status.
 */
export function poolUsage(pool) {
  const status = pool?.status;
  const history = Object.keys(status?.allocatedHistory ?? {}).filter(
    (ip) => !(ip in (status?.allocated ?? {})),
  ).length;
  if (!status || typeof status.total !== 'number') {
    const total = poolRanges(pool)
      .filter((r) => !r.error)
      .reduce((sum, r) => sum + Number(rangeSize(r.range)), 0);
    return { total, allocated: 0, history: 0, free: total, reported: false };
  }
  const total = status.total;
  const allocated = Math.max(0, total - (status.available ?? total));
  const free = Math.max(0, total - allocated - history);
  return { total, allocated, history, free, reported: true };
}

/**
 * Who an address of a pool belongs to: `{ip, state, detail, holder, lb, guest}`. `holder` is the
 * `namespace/name` of the load balancer holding it (allocated) or last holding it (history);
 * `lb` that load balancer when it exists; `guest` the guest cluster and Service behind it.
 */
export function addressOwner(pool, ipText, lbsById) {
  const ip = parseIp(ipText);
  if (!ip) return null;
  for (const r of poolRanges(pool)) {
    if (r.error || r.range.subnet.family !== ip.family) continue;
    const { range } = r;
    if (ip.value < range.subnet.network || ip.value > range.subnet.last) continue;
    const state = cellState(range, ip.value, r.allocated, r.history);
    const text = formatIp(ip.family, ip.value);
    const holder = state === 'allocated'
      ? r.allocated.get(ip.value)
      : state === 'history' ? r.history.get(ip.value) : null;
    const lb = holder ? (lbsById.get(holder) ?? null) : null;
    const detail = {
      allocated: `Allocated to the load balancer ${holder}.`,
      history: `Free. Last held by ${holder}, which gets it back first if it is created again.`,
      gateway: `The gateway of ${r.spec.subnet}: never handed out.`,
      excluded: `Not handed out: ${excludedWhy(range, ip.value)}.`,
      free: 'Free.',
    }[state];
    return { ip: text, state, detail, holder, lb, guest: lb ? guestOf(lb) : null };
  }
  return null;
}

/** A guest Service's address: its status ingress, else kube-vip's annotation, else ''. */
export function serviceAddress(svc) {
  const ingress = svc?.status?.loadBalancer?.ingress ?? [];
  const ip = ingress.find((i) => i.ip)?.ip;
  if (ip) return ip;
  return svc?.metadata?.annotations?.[KUBE_VIP_IPS] ?? '';
}

/** The guest load balancer of a guest Service, by the labels it carries. */
export function lbOfService(lbs, namespace, cluster, svc) {
  return lbs.find((lb) => {
    const g = guestOf(lb);
    return g && g.namespace === namespace && g.cluster === cluster
      && g.serviceNamespace === svc.metadata?.namespace && g.serviceName === svc.metadata?.name;
  }) ?? null;
}

/** Events newest first, at most `limit`, and how many were left out. */
export function latestEvents(events, limit) {
  const newest = [...events].reverse();
  return { shown: newest.slice(0, limit), older: Math.max(0, newest.length - limit) };
}

/** An Event's time (its last occurrence). */
export function eventTime(e) {
  return e?.lastTimestamp || e?.eventTime || e?.firstTimestamp || e?.metadata?.creationTimestamp || '';
}
