// The Guest clusters page (embedded store): each guest cluster's Services, their addresses and
// load balancers, and what the reconciler said about them. The clusters listed are those with
// load balancers (labelled with their cluster); any other can be looked up by name. A load
// balancer whose label cannot name a guest cluster is shown once, as broken, and the API is not
// asked about it; a cluster whose requests fail is asked again later and later (see retryDelay),
// not on every refresh.

import { empty, facts, failure, h, liveView, replace, slug, table, time } from './dom.js';
import {
  LABEL_CLUSTER, SVC_IPAM, SVC_PRIMARY, brokenGuestLbs, eventTime, guestClusters, idOf, isGuestClusterName,
  lbOfService, lbState, latestEvents, retryDelay, serviceAddress,
} from './model.js';

/** Events shown per guest cluster (newest first). */
const EVENTS_SHOWN = 10;

const key = (c) => `${c.namespace}/${c.cluster}`;

function serviceState(svc) {
  if (svc.metadata?.deletionTimestamp) return 'Deleting: its load balancer is being released';
  if (svc.spec?.type !== 'LoadBalancer') return `${svc.spec?.type ?? 'ClusterIP'}: no load balancer`;
  return serviceAddress(svc) ? 'Has its address' : 'Waiting for an address';
}

function servicesTable(cluster, services, lbs) {
  if (services.length === 0) {
    return empty(h('p', null, 'No Services. PUT one to ',
      h('code', null, `/v1/harvester/guestclusters/${cluster.namespace}/${cluster.cluster}/services/{namespace}/{name}`), '.'));
  }
  return table(`Services of ${cluster.cluster}`,
    ['Service', 'Type', 'Address', 'IPAM', 'Shares the address of', 'LoadBalancer', 'State'],
    [...services].sort((a, b) => idOf(a).localeCompare(idOf(b))).map((svc) => {
      const lb = lbOfService(lbs, cluster.namespace, cluster.cluster, svc);
      const annotations = svc.metadata?.annotations ?? {};
      return [
        idOf(svc),
        svc.spec?.type ?? 'ClusterIP',
        h('span', { 'data-address-of': idOf(svc) }, serviceAddress(svc) || '—'),
        svc.spec?.type === 'LoadBalancer' ? (annotations[SVC_IPAM] || 'pool') : '',
        annotations[SVC_PRIMARY] ?? '',
        lb ? h('a', { href: `#/loadbalancers?q=${encodeURIComponent(idOf(lb))}` }, `${idOf(lb)} (${lbState(lb).label})`)
          : annotations[SVC_PRIMARY] ? 'its primary’s' : '',
        serviceState(svc),
      ];
    }));
}

function eventsTable(cluster, events) {
  if (events.length === 0) return h('p', { class: 'hint' }, 'No Events.');
  const { shown, older } = latestEvents(events, EVENTS_SHOWN);
  return h('div', null,
    table(`Events of ${cluster.cluster}, newest first`, ['Time', 'Type', 'Reason', 'Service', 'Message'],
      shown.map((e) => [time(eventTime(e)), e.type ?? '', e.reason ?? '',
        `${e.involvedObject?.namespace ?? ''}/${e.involvedObject?.name ?? ''}`, e.message ?? '']), { captionHidden: true }),
    older ? h('p', { class: 'hint' }, `${older} older Events not shown.`) : null);
}

function clusterCard(cluster, entry, lbs) {
  const id = `guest-${slug(key(cluster))}`;
  let content;
  if (entry.error) {
    // On the Kubernetes backend guest clusters are not kept here: the API says so (404).
    content = entry.error.status === 404
      ? empty(h('p', null, entry.error.message))
      : failure(`the guest cluster ${key(cluster)}`, entry.error);
  } else {
    content = [
      h('h3', null, 'Services'),
      servicesTable(cluster, entry.services, lbs),
      h('h3', null, 'Events'),
      eventsTable(cluster, entry.events),
    ];
  }
  const lbCount = lbs.filter((lb) => lb.metadata?.labels?.[LABEL_CLUSTER] === cluster.cluster
    && lb.metadata?.namespace === cluster.namespace).length;
  return h('section', { class: 'card guest', 'aria-labelledby': id, 'data-cluster': key(cluster) },
    h('header', null, h('h2', { id }, cluster.cluster)),
    facts([['Namespace', cluster.namespace], ['Load balancers', String(lbCount)]]),
    content);
}

const NOT_A_NAME = 'is not a guest cluster name (a lowercase RFC 1123 label: a-z, 0-9 and \'-\', at most 63 characters), so no guest cluster is looked up for it';

/** One entry per load balancer whose guest-cluster label no cluster can have. */
function brokenList(broken) {
  return h('section', { class: 'card broken', 'aria-labelledby': 'broken-guest-lbs' },
    h('header', null, h('h2', { id: 'broken-guest-lbs' }, 'Broken load balancers')),
    h('ul', null, broken.map(({ lb, cluster }) => h('li', { 'data-broken': idOf(lb) },
      h('a', { href: `#/loadbalancers?q=${encodeURIComponent(idOf(lb))}` }, idOf(lb)),
      ': its label ', h('code', null, LABEL_CLUSTER), ' is ', h('code', null, JSON.stringify(cluster)),
      `, which ${NOT_A_NAME}.`))));
}

/** A looked-up name that no guest cluster can have: said once, never asked about. */
function badLookup(c) {
  return h('section', { class: 'card broken', 'data-lookup': key(c) },
    h('p', null, h('code', null, key(c)), ` ${NOT_A_NAME}.`));
}

export function guestClustersPage({ api, params }) {
  /** Per cluster: failures in a row, when it may be asked again, and the last answer. */
  const tries = new Map();
  const extra = new Map();
  if (params.get('namespace') && params.get('cluster')) {
    const c = { namespace: params.get('namespace'), cluster: params.get('cluster') };
    extra.set(key(c), c);
  }
  const view = liveView('guest clusters');
  const ns = h('input', { id: 'lookup-namespace', name: 'namespace', required: true, autocomplete: 'off', value: params.get('namespace') ?? '' });
  const name = h('input', { id: 'lookup-cluster', name: 'cluster', required: true, autocomplete: 'off', value: params.get('cluster') ?? '' });
  const lookup = h('form', {
    class: 'filters', 'aria-label': 'Look up a guest cluster',
    onsubmit: (e) => {
      e.preventDefault();
      if (!ns.value.trim() || !name.value.trim()) return;
      const c = { namespace: ns.value.trim(), cluster: name.value.trim() };
      extra.set(key(c), c);
      history.replaceState(null, '', `#/guestclusters?${new URLSearchParams(c)}`);
      refresh();
    },
  },
  h('div', { class: 'field' }, h('label', { for: 'lookup-namespace' }, 'Namespace'), ns),
  h('div', { class: 'field' }, h('label', { for: 'lookup-cluster' }, 'Guest cluster'), name),
  h('button', { type: 'submit' }, 'Show'));
  const el = h('div', { class: 'page guests' },
    h('h1', { tabindex: '-1' }, 'Guest clusters'),
    h('p', { class: 'lead' }, 'Guest clusters kept by this service (embedded store): their Services, the addresses they got and what the reconciler said. '
      + 'Clusters with load balancers are listed; look any other up by its namespace and name.'),
    lookup,
    view.nodes);
  const refresh = view.refresher(async () => {
    const lbs = await api.lbs();
    const clusters = [...guestClusters(lbs)];
    const badLookups = [];
    for (const c of extra.values()) {
      if (!isGuestClusterName(c.namespace) || !isGuestClusterName(c.cluster)) badLookups.push(c);
      else if (!clusters.some((d) => key(d) === key(c))) clusters.push(c);
    }
    const now = Date.now();
    const entries = await Promise.all(clusters.map(async (c) => {
      const t = tries.get(key(c)) ?? { failures: 0, next: 0, entry: null };
      tries.set(key(c), t);
      if (t.entry?.error && now < t.next) return t.entry;
      try {
        const [services, events] = await Promise.all([
          api.guestServices(c.namespace, c.cluster), api.guestEvents(c.namespace, c.cluster)]);
        t.failures = 0;
        t.entry = { services, events };
      } catch (e) {
        if (e.status === 401) throw e;
        t.failures += 1;
        t.next = Date.now() + retryDelay(t.failures);
        t.entry = { error: { status: e.status, code: e.code, message: e.message, describe: e.describe?.bind(e) } };
      }
      return t.entry;
    }));
    return { lbs, clusters, entries, broken: brokenGuestLbs(lbs), badLookups };
  }, ({ lbs, clusters, entries, broken, badLookups }) => {
    const notes = [
      broken.length ? brokenList(broken) : null,
      ...badLookups.map(badLookup),
    ].filter(Boolean);
    if (clusters.length === 0 && notes.length) {
      view.show(...notes);
      return;
    }
    if (clusters.length === 0) {
      view.show(empty(
        h('p', null, 'No guest cluster has a load balancer yet.'),
        h('p', null, 'On the embedded store, a guest cluster’s Services are PUT to ',
          h('code', null, '/v1/harvester/guestclusters/{namespace}/{cluster}/services/{namespace}/{name}'),
          '; on Kubernetes, guest clusters run ', h('code', null, 'harvester-cloud ccm'), ' and their load balancers show under Load balancers.')));
      return;
    }
    view.show(...notes, clusters.map((c, i) => clusterCard(c, entries[i], lbs)));
  });

  return { el, refresh };
}
