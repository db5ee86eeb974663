// The console's pure logic under node: addresses and ranges read as the service's IPAM reads
// them, the address map's cell states, and what the pages derive from the API's objects.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  cellState, entriesWithin, formatIp, indexByValue, mapPlan, parseCidr, parseIp, rangeSize, readRange,
} from '../../ui/ip.js';
import {
  BACKOFF_MAX_MS, POLL_MS, addressOwner, brokenGuestLbs, filterLbs, guestClusters, guestOf, lbAddress, lbOfService,
  lbPool, lbState, poolUsage, retryDelay, serviceAddress,
} from '../../ui/model.js';

const v = (text) => parseIp(text).value;

function mkPool(ranges, status) {
  return { metadata: { name: 'p' }, spec: { ranges }, status };
}

function mkLb(namespace, name, { labels, status, spec, deleting } = {}) {
  return {
    metadata: { namespace, name, labels, ...(deleting ? { deletionTimestamp: '2026-01-01T00:00:00Z' } : {}) },
    spec: { ipam: 'pool', ...spec },
    status,
  };
}

const ready = (s, extra = {}) => ({ conditions: [{ type: 'Ready', status: s, ...extra }] });

test('addresses parse and print as the service writes them', () => {
  assert.equal(formatIp(4, v('192.168.0.1')), '192.168.0.1');
  for (const [text, printed] of [
    ['2001:db8::1', '2001:db8::1'],
    ['2001:0db8:0000:0000:0000:0000:0000:0001', '2001:db8::1'],
    ['::', '::'],
    ['::1', '::1'],
    ['fe80::', 'fe80::'],
    ['1:0:0:1:0:0:0:1', '1:0:0:1::1'],
    ['1:0:0:2:0:0:3:4', '1::2:0:0:3:4'],
    ['1:2:3:4:5:6:7:8', '1:2:3:4:5:6:7:8'],
    ['::ffff:10.0.0.1', '::ffff:a00:1'],
  ]) {
    assert.equal(formatIp(6, v(text)), printed, text);
  }
  for (const bad of ['', '1.2.3', '1.2.3.256', '1.2.3.4.5', 'a.b.c.d', '1::2::3', '1:2:3:4:5:6:7', '12345::', 'x']) {
    assert.equal(parseIp(bad), null, bad);
  }
});

test('a subnet clears its host bits; prefixes past the family are refused', () => {
  const c = parseCidr('10.0.0.5/24');
  assert.equal(formatIp(4, c.network), '10.0.0.0');
  assert.equal(formatIp(4, c.last), '10.0.0.255');
  assert.equal(c.size, 256n);
  assert.equal(parseCidr('10.0.0.0/33'), null);
  assert.equal(parseCidr('10.0.0.0'), null);
  assert.equal(parseCidr('2001:db8::/64').size, 1n << 64n);
});

test('a range takes the IPAM defaults: first host to last host, gateway the first host', () => {
  const r = readRange({ subnet: '192.168.1.0/24' });
  assert.equal(formatIp(4, r.start), '192.168.1.1');
  assert.equal(formatIp(4, r.end), '192.168.1.254');
  assert.equal(formatIp(4, r.gateway), '192.168.1.1');
  // The gateway inside the range is not handed out (as src/ipam/range.rs counts it).
  assert.equal(rangeSize(r), 253n);
  // IPv6 has no broadcast address.
  const six = readRange({ subnet: '2001:db8::/120' });
  assert.equal(formatIp(6, six.end), '2001:db8::ff');
  // A point subnet is its own single address, with no gateway.
  const point = readRange({ subnet: '10.0.0.7/32' });
  assert.equal(point.gateway, null);
  assert.equal(rangeSize(point), 1n);
  // Reversed bounds are swapped; an explicit gateway outside the range costs nothing.
  const rev = readRange({ subnet: '10.0.0.0/24', rangeStart: '10.0.0.50', rangeEnd: '10.0.0.10', gateway: '10.0.0.254' });
  assert.equal(formatIp(4, rev.start), '10.0.0.10');
  assert.equal(rangeSize(rev), 41n);
  assert.ok(readRange({ subnet: '10.0.0.0/24', rangeStart: '10.0.1.1' }).error);
  assert.ok(readRange({ subnet: 'nope' }).error);
});

test('each cell of the map says what the address is', () => {
  const r = readRange({ subnet: '10.0.0.0/24', rangeStart: '10.0.0.10', rangeEnd: '10.0.0.20' });
  const allocated = indexByValue(4, { '10.0.0.10': 'default/a' });
  const history = indexByValue(4, { '10.0.0.11': 'default/b', '10.0.0.10': 'default/old' });
  const state = (ip) => cellState(r, v(ip), allocated, history);
  assert.equal(state('10.0.0.0'), 'excluded');
  assert.equal(state('10.0.0.1'), 'gateway');
  assert.equal(state('10.0.0.9'), 'excluded');
  assert.equal(state('10.0.0.10'), 'allocated');
  assert.equal(state('10.0.0.11'), 'history');
  assert.equal(state('10.0.0.12'), 'free');
  assert.equal(state('10.0.0.21'), 'excluded');
  assert.equal(state('10.0.0.255'), 'excluded');
  // Spelled differently, an IPv6 status key still finds its address.
  const six = indexByValue(6, { '2001:0db8:0:0:0:0:0:0005': 'default/x' });
  assert.equal(six.get(v('2001:db8::5')), 'default/x');
});

test('the map draws a cell per address up to a /22 and summarises beyond', () => {
  assert.deepEqual(mapPlan(readRange({ subnet: '10.0.0.0/22' })), { kind: 'grid', from: v('10.0.0.0'), to: v('10.0.3.255') });
  // A small range in a big subnet: the range, widened to whole rows of 16.
  const small = mapPlan(readRange({ subnet: '10.0.0.0/16', rangeStart: '10.0.5.3', rangeEnd: '10.0.5.40' }));
  assert.deepEqual(small, { kind: 'grid', from: v('10.0.5.0'), to: v('10.0.5.47') });
  assert.equal(mapPlan(readRange({ subnet: '10.0.0.0/21' })).kind, 'summary');
  assert.equal(mapPlan(readRange({ subnet: '2001:db8::/64' })).kind, 'summary');
  const index = indexByValue(4, { '10.0.0.9': 'a', '10.0.0.2': 'b', '10.1.0.0': 'c' });
  assert.deepEqual(entriesWithin(index, v('10.0.0.0'), v('10.0.0.255')).map(([, who]) => who), ['b', 'a']);
});

test('a pool usage comes from its status; before one, from its ranges', () => {
  const ranges = [{ subnet: '10.0.0.0/24', rangeStart: '10.0.0.10', rangeEnd: '10.0.0.20' }];
  assert.deepEqual(poolUsage(mkPool(ranges)), { total: 11, allocated: 0, history: 0, free: 11, reported: false });
  const status = {
    total: 11, available: 9,
    allocated: { '10.0.0.10': 'default/a', '10.0.0.11': 'default/b' },
    allocatedHistory: { '10.0.0.12': 'default/c', '10.0.0.11': 'default/b' },
  };
  assert.deepEqual(poolUsage(mkPool(ranges, status)), { total: 11, allocated: 2, history: 1, free: 8, reported: true });
});

test('an address owner: the load balancer, and the guest cluster and Service behind it', () => {
  const pool = mkPool([{ subnet: '10.0.0.0/24', rangeStart: '10.0.0.10', rangeEnd: '10.0.0.20' }], {
    total: 11, available: 9,
    allocated: { '10.0.0.10': 'default/vm-lb', '10.0.0.11': 'default/guest-lb' },
    allocatedHistory: { '10.0.0.12': 'default/gone' },
  });
  const guestLb = mkLb('default', 'guest-lb', {
    labels: {
      'cloudprovider.harvesterhci.io/cluster': 'c1',
      'cloudprovider.harvesterhci.io/serviceNamespace': 'apps',
      'cloudprovider.harvesterhci.io/serviceName': 'web',
    },
  });
  const lbs = new Map([['default/vm-lb', mkLb('default', 'vm-lb')], ['default/guest-lb', guestLb]]);
  const vm = addressOwner(pool, '10.0.0.10', lbs);
  assert.equal(vm.state, 'allocated');
  assert.equal(vm.holder, 'default/vm-lb');
  assert.equal(vm.guest, null);
  const guest = addressOwner(pool, '10.0.0.11', lbs);
  assert.deepEqual(guest.guest, { namespace: 'default', cluster: 'c1', serviceNamespace: 'apps', serviceName: 'web' });
  const history = addressOwner(pool, '10.0.0.12', lbs);
  assert.equal(history.state, 'history');
  assert.equal(history.holder, 'default/gone');
  assert.equal(history.lb, null);
  assert.match(addressOwner(pool, '10.0.0.255', lbs).detail, /broadcast/);
  assert.match(addressOwner(pool, '10.0.0.0', lbs).detail, /network address/);
  assert.match(addressOwner(pool, '10.0.0.30', lbs).detail, /outside the range 10\.0\.0\.10–10\.0\.0\.20/);
  assert.equal(addressOwner(pool, '10.0.0.1', lbs).state, 'gateway');
  assert.equal(addressOwner(pool, '10.9.0.1', lbs), null);
});

test('a load balancer state says why it is not Ready', () => {
  assert.equal(lbState(mkLb('d', 'a', { status: ready('True') })).why, null);
  const refused = lbState(mkLb('d', 'a', { status: ready('False', { reason: 'PoolExhausted', message: 'no IP addresses available' }) }));
  assert.deepEqual([refused.state, refused.why], ['not-ready', 'no IP addresses available']);
  assert.equal(lbState(mkLb('d', 'a', { status: ready('False', { reason: 'X' }) })).why, 'X');
  assert.equal(lbState(mkLb('d', 'a')).state, 'pending');
  assert.equal(lbState(mkLb('d', 'a', { status: ready('True'), deleting: true })).state, 'deleting');
});

test('a load balancer address, pool and filters', () => {
  const a = mkLb('ns1', 'a', { status: { ...ready('True'), allocatedAddress: { ip: '10.0.0.10', ipPool: 'p1' }, address: '10.0.0.10' } });
  const dhcp = mkLb('ns2', 'b', { spec: { ipam: 'dhcp' }, status: { ...ready('True'), allocatedAddress: { ip: '0.0.0.0' }, address: '0.0.0.0' } });
  const asks = mkLb('ns2', 'c', { spec: { ipPool: 'p2' }, status: ready('False', { message: 'm' }) });
  assert.deepEqual(lbAddress(a), { address: '10.0.0.10', dhcp: false });
  assert.deepEqual(lbAddress(dhcp), { address: '', dhcp: true });
  assert.equal(lbPool(a), 'p1');
  assert.equal(lbPool(asks), 'p2');
  const all = [a, dhcp, asks];
  const names = (f) => filterLbs(all, f).map((lb) => lb.metadata.name);
  assert.deepEqual(names({}), ['a', 'b', 'c']);
  assert.deepEqual(names({ namespace: 'ns2' }), ['b', 'c']);
  assert.deepEqual(names({ pool: 'p2' }), ['c']);
  assert.deepEqual(names({ state: 'not-ready' }), ['c']);
  assert.deepEqual(names({ text: '10.0.0.10' }), ['a']);
  assert.deepEqual(names({ text: 'NS2/B' }), ['b']);
});

test('guest clusters and their Services are found through the load balancers labels', () => {
  const labels = (cluster, ns, name) => ({
    'cloudprovider.harvesterhci.io/cluster': cluster,
    'cloudprovider.harvesterhci.io/serviceNamespace': ns,
    'cloudprovider.harvesterhci.io/serviceName': name,
  });
  const lbs = [
    mkLb('h2', 'x', { labels: labels('c2', 'default', 'web') }),
    mkLb('h1', 'y', { labels: labels('c1', 'default', 'web') }),
    mkLb('h1', 'z', { labels: labels('c1', 'default', 'api') }),
    mkLb('h1', 'vm'),
  ];
  assert.deepEqual(guestClusters(lbs), [{ namespace: 'h1', cluster: 'c1' }, { namespace: 'h2', cluster: 'c2' }]);
  assert.equal(guestOf(lbs[3]), null);
  const svc = { metadata: { namespace: 'default', name: 'api' } };
  assert.equal(lbOfService(lbs, 'h1', 'c1', svc).metadata.name, 'z');
  assert.equal(lbOfService(lbs, 'h2', 'c2', svc), null);
  assert.equal(serviceAddress({ status: { loadBalancer: { ingress: [{ ip: '10.0.0.3' }] } } }), '10.0.0.3');
  assert.equal(serviceAddress({ metadata: { annotations: { 'kube-vip.io/loadbalancerIPs': '0.0.0.0' } } }), '0.0.0.0');
  assert.equal(serviceAddress({}), '');
});

test('a guest-cluster label no cluster can have makes one broken load balancer, not a cluster', () => {
  const labelled = (cluster) => ({ labels: { 'cloudprovider.harvesterhci.io/cluster': cluster } });
  const lbs = [
    mkLb('h1', 'good', labelled('c1')),
    mkLb('h1', 'upper', labelled('Bad_Name')),
    mkLb('h1', 'html', labelled('<html>')),
    mkLb('h1', 'long', labelled('x'.repeat(64))),
  ];
  assert.deepEqual(guestClusters(lbs), [{ namespace: 'h1', cluster: 'c1' }]);
  assert.deepEqual(brokenGuestLbs(lbs).map(({ lb, cluster }) => [lb.metadata.name, cluster]),
    [['html', '<html>'], ['long', 'x'.repeat(64)], ['upper', 'Bad_Name']]);
});

test('a failing request is tried again later and later, up to a minute; a success resets it', () => {
  assert.equal(retryDelay(0), POLL_MS);
  assert.deepEqual([1, 2, 3, 4, 5, 6, 7].map(retryDelay), [2000, 4000, 8000, 16000, 32000, 60000, 60000]);
  assert.equal(retryDelay(1000), BACKOFF_MAX_MS);
});
