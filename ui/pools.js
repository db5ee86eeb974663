// The Pools page: each IPPool's utilisation as a bar and its ranges as an address map (one cell
// per address up to a /22, summarised beyond); choosing an address shows who holds it: the
// LoadBalancer, and for a guest load balancer the guest cluster and its Service.

import { empty, facts, h, liveView, slug, table } from './dom.js';
import { formatIp, mapPlan, ROW, cellState, entriesWithin, rangeSize } from './ip.js';
import { addressOwner, idOf, lbState, poolRanges, poolUsage } from './model.js';

const STATE_TEXT = {
  allocated: 'allocated',
  history: 'free, in history',
  free: 'free',
  excluded: 'excluded',
  gateway: 'gateway',
};
/** Held and remembered addresses listed for a summarised range. */
const SUMMARY_ROWS = 256;

const number = (n) => Number(n).toLocaleString('en');

function legend() {
  return h('ul', { class: 'legend', 'aria-label': 'Address map colours' },
    ['free', 'allocated', 'history', 'excluded', 'gateway'].map((s) =>
      h('li', null, h('span', { class: `swatch cell ${s}`, 'aria-hidden': 'true' }), STATE_TEXT[s])));
}

function usageBar(pool) {
  const u = poolUsage(pool);
  const pct = (n) => (u.total > 0 ? (100 * n) / u.total : 0);
  const percent = Math.round(pct(u.allocated));
  const text = u.reported
    ? `${number(u.allocated)} of ${number(u.total)} addresses allocated (${percent}%), `
      + `${number(u.history)} in history, ${number(u.free)} free`
    : `${number(u.total)} addresses; the reconciler has not reported usage yet`;
  const allocated = h('span', { class: 'seg allocated' });
  allocated.style.width = `${pct(u.allocated)}%`;
  const history = h('span', { class: 'seg history' });
  history.style.width = `${pct(u.history)}%`;
  return h('div', { class: 'usage' },
    h('div', { class: 'bar', role: 'img', 'aria-label': `Utilisation: ${text}` }, allocated, history),
    h('p', { class: 'usage-text', 'data-usage': `${u.allocated}/${u.total}` }, text));
}

function scopeText(scope) {
  return (scope ?? []).map((s) => [['project', s.project], ['namespace', s.namespace], ['guest cluster', s.guestCluster]]
    .filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', '));
}

function cellLabel(text, state, holder) {
  if (state === 'allocated') return `${text}: allocated to ${holder}`;
  if (state === 'history') return `${text}: free, last held by ${holder}`;
  return `${text}: ${STATE_TEXT[state]}`;
}

/** Arrow keys, Home and End move between the cells of a map (one tab stop per map). */
function gridKeys(event) {
  const moves = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: Number(ROW), ArrowUp: -Number(ROW) };
  const cells = [...event.currentTarget.querySelectorAll('button.cell')];
  const at = cells.indexOf(document.activeElement);
  if (at < 0) return;
  let to;
  if (event.key in moves) to = at + moves[event.key];
  else if (event.key === 'Home') to = 0;
  else if (event.key === 'End') to = cells.length - 1;
  else return;
  event.preventDefault();
  if (to < 0 || to >= cells.length) return;
  cells[at].tabIndex = -1;
  cells[to].tabIndex = 0;
  cells[to].focus();
}

function rowLabel(subnet, value) {
  const text = formatIp(subnet.family, value);
  if (subnet.family === 6) return text.slice(text.lastIndexOf(':'));
  const octets = text.split('.');
  return subnet.prefix < 24n ? `.${octets[2]}.${octets[3]}` : `.${octets[3]}`;
}

function grid(poolName, r, plan, selected, select) {
  const { range, allocated, history } = r;
  const family = range.subnet.family;
  const rows = [];
  let focusable = null;
  const cells = [];
  for (let start = plan.from; start <= plan.to; start += ROW) {
    const row = [];
    for (let v = start; v < start + ROW && v <= plan.to; v++) {
      const text = formatIp(family, v);
      const state = cellState(range, v, allocated, history);
      const holder = state === 'allocated' ? allocated.get(v) : state === 'history' ? history.get(v) : null;
      const label = cellLabel(text, state, holder);
      const isSelected = selected === text;
      const cell = h('button', {
        type: 'button',
        class: `cell ${state}${isSelected ? ' selected' : ''}`,
        'data-ip': text,
        'data-state': state,
        'data-key': `cell:${poolName}:${text}`,
        'aria-label': label,
        'aria-pressed': isSelected ? 'true' : 'false',
        title: label,
        tabindex: '-1',
        onclick: () => select(text),
      });
      if (isSelected) focusable = cell;
      cells.push(cell);
      row.push(cell);
    }
    rows.push(h('div', { class: 'ipmap-row' },
      h('span', { class: 'ipmap-label', 'aria-hidden': 'true' }, rowLabel(range.subnet, start)), row));
  }
  (focusable ?? cells[0]).tabIndex = 0;
  return h('div', {
    class: 'ipmap',
    role: 'group',
    'aria-label': `Address map of ${r.spec.subnet} (arrow keys move between addresses)`,
    onkeydown: gridKeys,
  }, rows);
}

function summary(poolName, r, selected, select) {
  const { range, allocated, history } = r;
  const family = range.subnet.family;
  const held = entriesWithin(allocated, range.subnet.network, range.subnet.last).map(([v, who]) => [v, who, 'allocated']);
  const kept = entriesWithin(history, range.start, range.end)
    .filter(([v]) => !allocated.has(v)).map(([v, who]) => [v, who, 'history']);
  const all = [...held, ...kept].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const shown = all.slice(0, SUMMARY_ROWS);
  const note = h('p', { class: 'hint' },
    `${number(rangeSize(range))} addresses: too many for one cell each. `
    + `${number(held.length)} allocated and ${number(kept.length)} in history`
    + (all.length > shown.length ? `; the first ${shown.length} are listed.` : '.'));
  if (all.length === 0) return note;
  return h('div', null, note, table(`Held and remembered addresses of ${r.spec.subnet}`,
    ['Address', 'State', 'Load balancer'],
    shown.map(([v, who, state]) => {
      const text = formatIp(family, v);
      return [
        h('button', {
          type: 'button',
          class: `link${selected === text ? ' selected' : ''}`,
          'data-ip': text,
          'data-key': `cell:${poolName}:${text}`,
          'aria-pressed': selected === text ? 'true' : 'false',
          onclick: () => select(text),
        }, text),
        STATE_TEXT[state],
        who,
      ];
    }), { captionHidden: true }));
}

function rangeView(poolName, r, selected, select) {
  if (r.error) return h('p', { class: 'state error' }, `Range ${JSON.stringify(r.spec)}: ${r.error}`);
  const { range } = r;
  const family = range.subnet.family;
  const caption = [
    r.spec.subnet,
    `range ${formatIp(family, range.start)}–${formatIp(family, range.end)}`,
    range.gateway !== null ? `gateway ${formatIp(family, range.gateway)}` : 'no gateway',
  ].join(' · ');
  const plan = mapPlan(range);
  return h('figure', { class: 'range' },
    h('figcaption', null, caption),
    plan.kind === 'grid' ? grid(poolName, r, plan, selected, select) : summary(poolName, r, selected, select));
}

function ownerView(pool, ip, lbsById) {
  const owner = addressOwner(pool, ip, lbsById);
  if (!owner) return h('p', null, `${ip} is not in this pool.`);
  const parts = [
    h('h3', null, owner.ip, ' ', h('span', { class: `badge ${owner.state}` }, STATE_TEXT[owner.state])),
    h('p', null, owner.detail),
  ];
  if (owner.holder) {
    const lbLink = h('a', { href: `#/loadbalancers?q=${encodeURIComponent(owner.holder)}` }, owner.holder);
    const rows = [['LoadBalancer', owner.lb ? lbLink : h('span', null, owner.holder, ' (does not exist now)')]];
    if (owner.lb) rows.push(['Its state', lbState(owner.lb).label]);
    if (owner.guest) {
      const g = owner.guest;
      const q = new URLSearchParams({ namespace: g.namespace, cluster: g.cluster });
      rows.push(['Guest cluster', h('a', { href: `#/guestclusters?${q}` }, `${g.cluster} (namespace ${g.namespace})`)]);
      rows.push(['Guest Service', `${g.serviceNamespace}/${g.serviceName}`]);
    }
    parts.push(facts(rows));
  }
  return h('div', { class: 'owner-detail', 'data-owner': owner.ip }, parts);
}

function poolCard(pool, lbsById, selected, select) {
  const name = pool.metadata?.name ?? '';
  const spec = pool.spec ?? {};
  const labels = pool.metadata?.labels ?? {};
  const id = `pool-${slug(name)}`;
  const ranges = poolRanges(pool);
  const selectedIp = selected?.pool === name ? selected.ip : null;
  const onSelect = (ip) => select(name, ip);
  const ready = (pool.status?.conditions ?? []).find((c) => c.type === 'Ready');
  return h('section', { class: 'card pool', 'aria-labelledby': id, 'data-pool': name },
    h('header', null,
      h('h2', { id }, name),
      labels['loadbalancer.harvesterhci.io/global-ip-pool'] === 'true' ? h('span', { class: 'tag' }, 'global') : null,
      pool.metadata?.deletionTimestamp ? h('span', { class: 'badge deleting' }, 'Deleting') : null,
      ready && ready.status !== 'True' ? h('span', { class: 'badge not-ready' }, `Not ready: ${ready.message || ready.reason || ''}`) : null),
    spec.description ? h('p', null, spec.description) : null,
    usageBar(pool),
    facts([
      ['Network', spec.selector?.network ?? ''],
      ['Priority', spec.selector?.priority ?? ''],
      ['Scope', scopeText(spec.selector?.scope).map((s) => h('span', { class: 'scope' }, s))],
      ['Last allocated', pool.status?.lastAllocated ?? ''],
    ]),
    ranges.map((r) => rangeView(name, r, selectedIp, onSelect)),
    h('div', { class: 'owner', 'aria-live': 'polite', 'data-owner-of': name },
      selectedIp ? ownerView(pool, selectedIp, lbsById) : h('p', { class: 'hint' }, 'Choose an address to see who holds it.')));
}

export function poolsPage({ api }) {
  const view = liveView('pools');
  const el = h('div', { class: 'page pools' },
    h('h1', { tabindex: '-1' }, 'Pools'),
    h('p', { class: 'lead' }, 'IP pools, how full they are, and which load balancer holds each address.'),
    legend(),
    view.nodes);
  let data = null;
  let selected = null;

  function render() {
    const { pools, lbs } = data;
    if (pools.length === 0) {
      view.show(empty(
        h('p', null, 'No IP pools yet.'),
        h('p', null, 'Create one with ', h('code', null, 'POST /v1/harvester/loadbalancer.harvesterhci.io.ippools'),
          ' (see the manual, “Load balancers”); it shows here within seconds.')));
      return;
    }
    const lbsById = new Map(lbs.map((lb) => [idOf(lb), lb]));
    view.show([...pools]
      .sort((a, b) => (a.metadata?.name ?? '').localeCompare(b.metadata?.name ?? ''))
      .map((p) => poolCard(p, lbsById, selected, select)));
  }

  function select(pool, ip) {
    selected = { pool, ip };
    render();
  }

  const refresh = view.refresher(async () => {
    const [pools, lbs] = await Promise.all([api.pools(), api.lbs()]);
    return { pools, lbs };
  }, (loaded) => {
    data = loaded;
    render();
  });

  return { el, refresh };
}
