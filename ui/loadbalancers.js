// The Load balancers page: every LoadBalancer, filtered by namespace, pool, state and text; each
// opens to its address, pool, listeners, conditions, Events, the guest cluster behind it, and why
// it is not Ready when it is not. The filters are kept in the page's address (`#/loadbalancers?…`).

import { empty, facts, failure, h, liveView, loading, replace, table, time } from './dom.js';
import {
  STATES, eventTime, filterLbs, guestOf, idOf, lbAddress, lbPool, lbState, latestEvents,
} from './model.js';

const FILTERS = ['namespace', 'pool', 'state', 'q'];
/** Events shown per load balancer (newest first). */
const EVENTS_SHOWN = 20;

function select(id, label, options, value, onchange) {
  return h('div', { class: 'field' },
    h('label', { for: id }, label),
    h('select', { id, onchange: (e) => onchange(e.target.value) },
      h('option', { value: '' }, 'All'),
      options.map((o) => h('option', { value: o.value, selected: o.value === value }, o.label))));
}

function eventsView(entry) {
  if (!entry || entry.loading) return loading('events');
  if (entry.error) return failure('events', entry.error);
  if (entry.events.length === 0) {
    return empty(h('p', null, 'No Events about it (Events are kept for an hour).'));
  }
  const { shown, older } = latestEvents(entry.events, EVENTS_SHOWN);
  return h('div', null,
    table('Events, newest first', ['Time', 'Type', 'Reason', 'Message'],
      shown.map((e) => [time(eventTime(e)), e.type ?? '', e.reason ?? '', e.message ?? '']), { captionHidden: true }),
    older ? h('p', { class: 'hint' }, `${older} older Events not shown.`) : null);
}

function listeners(lb) {
  return (lb.spec?.listeners ?? []).map((l) =>
    h('span', { class: 'listener' }, `${l.name ? `${l.name}: ` : ''}${l.port}/${l.protocol} → ${l.backendPort}`));
}

function details(lb, entry, poolNames) {
  const state = lbState(lb);
  const { address, dhcp } = lbAddress(lb);
  const allocated = lb.status?.allocatedAddress ?? {};
  const guest = guestOf(lb);
  const warning = entry?.events ? [...entry.events].reverse().find((e) => e.type === 'Warning') : null;
  const rows = [
    ['IPAM', dhcp ? 'DHCP' : 'pool'],
    ['Address', address ? [address, allocated.mask ? ` (mask ${allocated.mask}${allocated.gateway ? `, gateway ${allocated.gateway}` : ''})` : ''] : (dhcp ? 'waiting for the DHCP lease' : 'none yet')],
    ['Pool', lbPool(lb)
      ? (poolNames.has(lbPool(lb)) ? h('a', { href: '#/pools' }, lbPool(lb)) : `${lbPool(lb)} (no such pool)`)
      : (dhcp ? '' : 'chosen by the pools’ selectors')],
    ['Pool asked for', lb.spec?.ipPool ?? ''],
    ['Workload type', lb.spec?.workloadType ?? 'vm'],
    ['Listeners', listeners(lb)],
    ['Description', lb.spec?.description ?? ''],
    ['Created', time(lb.metadata?.creationTimestamp)],
  ];
  if (guest) {
    const q = new URLSearchParams({ namespace: guest.namespace, cluster: guest.cluster });
    rows.push(['Guest cluster', h('a', { href: `#/guestclusters?${q}` }, `${guest.cluster} (namespace ${guest.namespace})`)]);
    rows.push(['Guest Service', `${guest.serviceNamespace}/${guest.serviceName}`]);
  }
  const conditions = lb.status?.conditions ?? [];
  return h('div', { class: 'lb-body' },
    state.why ? h('p', { class: `why ${state.state}`, role: 'note' },
      h('strong', null, 'Why it is not Ready: '), state.why,
      warning && warning.message && warning.message !== state.why
        ? [h('br'), h('span', null, `Latest warning (${warning.reason}): ${warning.message}`)] : null) : null,
    facts(rows),
    conditions.length
      ? table('Conditions', ['Type', 'Status', 'Reason', 'Message', 'Last change'],
        conditions.map((c) => [c.type ?? '', c.status ?? '', c.reason ?? '', c.message ?? '', time(c.lastTransitionTime || c.lastUpdateTime)]))
      : h('p', { class: 'hint' }, 'No conditions reported yet.'),
    h('h3', null, 'Events'),
    eventsView(entry));
}

export function loadBalancersPage({ api, params }) {
  const filters = Object.fromEntries(FILTERS.map((f) => [f, params.get(f) ?? '']));
  const open = new Set();
  const events = new Map();
  let data = null;

  const view = liveView('load balancers');
  const controls = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter load balancers', onsubmit: (e) => e.preventDefault() });
  const el = h('div', { class: 'page loadbalancers' },
    h('h1', { tabindex: '-1' }, 'Load balancers'),
    h('p', { class: 'lead' }, 'Every LoadBalancer, its address and pool, and why it is not Ready when it is not.'),
    controls,
    view.nodes);

  function setFilter(name, value) {
    filters[name] = value;
    const q = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
    history.replaceState(null, '', `#/loadbalancers${q.size ? `?${q}` : ''}`);
    if (data) render();
  }

  function renderControls() {
    const lbs = data?.lbs ?? [];
    const namespaces = [...new Set(lbs.map((lb) => lb.metadata?.namespace ?? ''))].sort();
    const pools = [...new Set([...(data?.pools ?? []).map((p) => p.metadata?.name ?? ''), ...lbs.map(lbPool).filter(Boolean)])].sort();
    const withCurrent = (list, v) => (v && !list.includes(v) ? [...list, v] : list);
    replace(controls,
      select('filter-namespace', 'Namespace', withCurrent(namespaces, filters.namespace).map((n) => ({ value: n, label: n })), filters.namespace, (v) => setFilter('namespace', v)),
      select('filter-pool', 'Pool', withCurrent(pools, filters.pool).map((n) => ({ value: n, label: n })), filters.pool, (v) => setFilter('pool', v)),
      select('filter-state', 'State', STATES, filters.state, (v) => setFilter('state', v)),
      h('div', { class: 'field' },
        h('label', { for: 'filter-q' }, 'Name or address'),
        h('input', { id: 'filter-q', type: 'search', value: filters.q, oninput: (e) => setFilter('q', e.target.value) })));
  }

  function toggled(id, event) {
    const isOpen = event.currentTarget.open;
    if (isOpen === open.has(id)) return;
    if (isOpen) {
      open.add(id);
      if (!events.has(id)) events.set(id, { loading: true });
      loadEvents(id).then(render);
    } else {
      open.delete(id);
    }
  }

  function item(lb) {
    const id = idOf(lb);
    const state = lbState(lb);
    const { address, dhcp } = lbAddress(lb);
    return h('li', null,
      h('details', { open: open.has(id), 'data-lb': id, ontoggle: (e) => toggled(id, e) },
        h('summary', { 'data-key': `lb:${id}` },
          h('span', { class: 'lb-name' }, id),
          h('span', { class: `badge ${state.state}` }, state.label),
          h('span', { class: 'lb-address' }, address || (dhcp ? 'DHCP' : '—')),
          h('span', { class: 'lb-pool' }, lbPool(lb) ? `pool ${lbPool(lb)}` : '')),
        open.has(id) ? details(lb, events.get(id), new Set((data?.pools ?? []).map((p) => p.metadata?.name))) : null));
  }

  function render() {
    const lbs = data.lbs;
    if (lbs.length === 0) {
      view.show(empty(
        h('p', null, 'No load balancers yet.'),
        h('p', null, 'Create one with ', h('code', null, 'POST /v1/harvester/loadbalancer.harvesterhci.io.loadbalancers'),
          ', or give a guest cluster a Service of type LoadBalancer.')));
      return;
    }
    const matching = filterLbs(lbs, { ...filters, text: filters.q })
      .sort((a, b) => idOf(a).localeCompare(idOf(b)));
    view.show(
      h('p', { class: 'count', id: 'lb-count' }, `Showing ${matching.length} of ${lbs.length} load balancers`),
      matching.length
        ? h('ul', { class: 'lbs', 'aria-describedby': 'lb-count' }, matching.map(item))
        : empty(h('p', null, 'No load balancer matches these filters.')));
  }

  async function loadEvents(id) {
    const [namespace, name] = id.split('/');
    try {
      events.set(id, { events: await api.lbEvents(namespace, name) });
    } catch (e) {
      events.set(id, { error: e });
    }
  }

  const refresh = view.refresher(async () => {
    const [lbs, pools] = await Promise.all([api.lbs(), api.pools()]);
    const ids = new Set(lbs.map(idOf));
    for (const id of [...open]) if (!ids.has(id)) open.delete(id);
    await Promise.all([...open].map(loadEvents));
    return { lbs, pools, events: [...open].map((id) => events.get(id)) };
  }, ({ lbs, pools }) => {
    data = { lbs, pools };
    // Not under the reader's hands: a filter being used keeps its options until it is left.
    if (!controls.contains(document.activeElement)) renderControls();
    render();
  });

  renderControls();
  return { el, refresh };
}
