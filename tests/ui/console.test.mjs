// The web console in a real browser (Debian's chromium, headless) against the real binary on a
// fresh embedded store: signing in and a wrong token, the pools' bars and address maps following
// the load balancers, an address's owner, the load balancers' filters, conditions and Events, the
// guest clusters, a cloud-config issued from the form byte for byte as the API returns it, the
// security headers and the CSP in force, loading, empty and error states, accessibility (axe-core)
// and a narrow window. Each page's screenshot goes to docs/src/screenshots/ for the manual.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import {
  GUESTS, KUBECONFIG, LBS, POOLS, accessibilityViolations, allocated, call, eventually,
  launchBrowser, mkLb, mkPool, ok, screenshot, signIn, startServer,
} from './support.mjs';

const cell = (page, ip) => page.locator(`button.cell[data-ip="${ip}"]`);
const stateOf = (page, ip) => cell(page, ip).getAttribute('data-state');
const usageOf = (page, pool) => page.locator(`[data-pool="${pool}"] .usage-text`).getAttribute('data-usage');

async function waitForState(page, ip, want) {
  await eventually(`${ip} to be ${want} on the map`, async () => (await stateOf(page, ip)) === want);
}

async function waitForUsage(page, pool, want) {
  await eventually(`${pool}'s bar to read ${want}`, async () => (await usageOf(page, pool)) === want);
}

function guestService(namespace, name, { annotations = {}, port = 80 } = {}) {
  return {
    apiVersion: 'v1', kind: 'Service',
    metadata: { name, namespace, annotations },
    spec: { type: 'LoadBalancer', ports: [{ name: 'http', port, protocol: 'TCP' }] },
  };
}

describe('the console on the embedded store', () => {
  let server;
  let browser;

  before(async () => {
    server = await startServer();
    browser = await launchBrowser();
    // The one global pool, and a big pool for namespace `big` (summarised, not drawn).
    await ok(server, 'POST', POOLS, mkPool('pool1', '192.168.100.0/24', '192.168.100.10', '192.168.100.20',
      { description: 'VLAN 100, every namespace' }), 201);
    await ok(server, 'POST', POOLS, {
      metadata: { name: 'big' },
      spec: { ranges: [{ subnet: '10.20.0.0/16' }], selector: { priority: 10, scope: [{ namespace: 'big' }] } },
    }, 201);
  });

  after(async () => {
    await browser?.close();
    await server?.stop();
  });

  test('the console is served with its security headers and caching, without a token', async () => {
    const index = await fetch(`${server.url}/ui/`);
    assert.equal(index.status, 200);
    assert.equal(index.headers.get('content-type'), 'text/html; charset=utf-8');
    const csp = index.headers.get('content-security-policy');
    for (const directive of ["default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'",
      "object-src 'none'", "base-uri 'none'", "require-trusted-types-for 'script'"]) {
      assert.ok(csp.includes(directive), `${directive} in ${csp}`);
    }
    assert.ok(!csp.includes('unsafe-inline') && !csp.includes('unsafe-eval'), csp);
    assert.equal(index.headers.get('x-content-type-options'), 'nosniff');
    assert.equal(index.headers.get('cache-control'), 'no-cache');
    const etag = index.headers.get('etag');
    assert.match(etag, /^"[0-9a-f]{32}"$/);
    const again = await fetch(`${server.url}/ui/`, { headers: { 'If-None-Match': etag } });
    assert.equal(again.status, 304);
    const html = await index.text();
    // Every asset the page names is served, with its type; nothing comes from elsewhere.
    const refs = [...html.matchAll(/(?:src|href)="([^"#]+)"/g)].map((m) => m[1]);
    assert.ok(refs.length >= 3, refs.join());
    for (const ref of refs) {
      assert.ok(!/^(https?:)?\/\//.test(ref), `${ref} is not third-party`);
      const r = await fetch(new URL(ref, `${server.url}/ui/`));
      assert.equal(r.status, 200, ref);
    }
    const js = await fetch(`${server.url}/ui/app.js`);
    assert.equal(js.headers.get('content-type'), 'text/javascript; charset=utf-8');
    assert.equal((await fetch(`${server.url}/ui/app.css`)).headers.get('content-type'), 'text/css; charset=utf-8');
    const bare = await fetch(`${server.url}/ui`, { redirect: 'manual' });
    assert.equal(bare.status, 308);
    assert.equal(bare.headers.get('location'), '/ui/');
    assert.equal((await fetch(`${server.url}/ui/nothing.js`)).status, 404);
    // The API behind it still wants the token.
    assert.equal((await fetch(`${server.url}${POOLS}`)).status, 401);
  });

  test('the CSP is in force: no inline script runs and no HTML string reaches the DOM', async () => {
    const page = await browser.page();
    await page.goto(`${server.url}/ui/`);
    await page.getByLabel('Admin token').waitFor();
    const before = browser.problems.length;
    const outcome = await page.evaluate(() => {
      const results = {};
      try {
        document.body.insertAdjacentHTML('beforeend', '<b id="injected">x</b>');
        results.html = 'written';
      } catch (e) {
        results.html = e.name;
      }
      window.inlineRan = false;
      try {
        const s = document.createElement('script');
        s.append('window.inlineRan = true');
        document.body.append(s);
      } catch (e) {
        results.script = e.name;
      }
      results.inlineRan = window.inlineRan;
      return results;
    });
    assert.equal(outcome.html, 'TypeError', 'Trusted Types refuse HTML strings');
    assert.equal(outcome.inlineRan, false, 'inline script does not run');
    assert.equal(await page.locator('#injected').count(), 0);
    // The browser reported the refusals; they were this test's doing.
    const reported = browser.problems.splice(before);
    assert.ok(reported.some((p) => /Trusted|Content Security Policy/i.test(p)), reported.join('\n'));
    await page.close();
  });

  test('a wrong token shows a clear error and is not kept', async () => {
    const page = await browser.page();
    await signIn(page, server, 'token-wrong:not-the-secret');
    const error = page.locator('#signin-error');
    await error.waitFor({ state: 'visible' });
    assert.match(await error.textContent(), /The service refused the token \(401 Unauthorized\)/);
    assert.equal(await page.getByLabel('Admin token').getAttribute('aria-invalid'), 'true');
    assert.equal(await page.locator('#nav').isVisible(), false);
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
    // Something that is not a token at all.
    await page.getByLabel('Admin token').fill('garbage');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await eventually('the malformed token refused', async () => /401 Unauthorized/.test(await error.textContent()));
    await screenshot(page, 'sign-in-refused');
    // A token that stops working while signed in sends the reader back to sign in, saying why.
    await signIn(page, server);
    await page.locator('#nav').waitFor({ state: 'visible' });
    await page.evaluate(() => sessionStorage.setItem('harvester-cloud.token', 'token-abcde:revoked'));
    await page.reload();
    await error.waitFor({ state: 'visible' });
    assert.match(await error.textContent(), /refused the token \(401 Unauthorized\).*Sign in again/);
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
    await page.close();
  });

  test('signing in keeps the token in this tab only: no cookie, no URL, no other tab', async () => {
    const page = await browser.page();
    await signIn(page, server);
    await page.locator('#nav').waitFor({ state: 'visible' });
    await page.getByRole('heading', { level: 1, name: 'Pools' }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('harvester-cloud.token')), server.token);
    assert.equal(await page.evaluate(() => localStorage.length), 0);
    assert.equal(await page.evaluate(() => document.cookie), '');
    assert.deepEqual(await browser.context.cookies(), []);
    assert.ok(!page.url().includes(server.token.split(':')[1]));
    // A reload stays signed in; another tab does not share it.
    await page.reload();
    await page.locator('#nav').waitFor({ state: 'visible' });
    const other = await browser.context.newPage();
    await other.goto(`${server.url}/ui/`);
    await other.getByLabel('Admin token').waitFor();
    assert.equal(await other.locator('#nav').isVisible(), false);
    await other.close();
    // Signing out forgets it.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('Admin token').waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
    await page.close();
  });

  test('the pools page: bar and address map follow the load balancers', async () => {
    const page = await browser.page();
    await signIn(page, server);
    const card = page.locator('[data-pool="pool1"]');
    await card.waitFor();
    // 192.168.100.10-20: 11 addresses, the gateway .1 outside the range.
    await waitForUsage(page, 'pool1', '0/11');
    assert.equal(await stateOf(page, '192.168.100.0'), 'excluded');
    assert.equal(await stateOf(page, '192.168.100.1'), 'gateway');
    assert.equal(await stateOf(page, '192.168.100.9'), 'excluded');
    assert.equal(await stateOf(page, '192.168.100.10'), 'free');
    assert.equal(await stateOf(page, '192.168.100.255'), 'excluded');
    assert.equal(await card.locator('button.cell').count(), 256);
    const barWidth = () => card.locator('.bar .seg.allocated').evaluate((e) => e.getBoundingClientRect().width);
    assert.equal(await barWidth(), 0);

    await ok(server, 'POST', LBS, mkLb('default', 'web-a'), 201);
    await ok(server, 'POST', LBS, mkLb('default', 'web-b'), 201);
    const a = (await allocated(server, 'default', 'web-a')).status.allocatedAddress.ip;
    const b = (await allocated(server, 'default', 'web-b')).status.allocatedAddress.ip;
    await waitForState(page, a, 'allocated');
    await waitForState(page, b, 'allocated');
    await waitForUsage(page, 'pool1', '2/11');
    assert.ok((await barWidth()) > 0, 'the bar shows the allocated share');
    assert.match(await card.locator('.usage-text').textContent(), /^2 of 11 addresses allocated \(18%\), 0 in history, 9 free$/);

    // Deleted, web-a's address goes to the pool's history.
    await ok(server, 'DELETE', `${LBS}/default/web-a`);
    await waitForState(page, a, 'history');
    await waitForUsage(page, 'pool1', '1/11');
    assert.match(await card.locator('.usage-text').textContent(), /1 in history/);
    const historyWidth = await card.locator('.bar .seg.history').evaluate((e) => e.getBoundingClientRect().width);
    assert.ok(historyWidth > 0);

    // A pool larger than a /22 is summarised, with its held addresses listed.
    const big = page.locator('[data-pool="big"]');
    assert.equal(await big.locator('button.cell').count(), 0);
    assert.match(await big.textContent(), /65,533 addresses: too many for one cell each/);
    await ok(server, 'POST', LBS, mkLb('big', 'bulk'), 201);
    const bulk = (await allocated(server, 'big', 'bulk')).status.allocatedAddress.ip;
    await big.locator(`button[data-ip="${bulk}"]`).waitFor();
    await page.close();
  });

  test('choosing an address shows its owner: the load balancer, the guest cluster and Service', async () => {
    await ok(server, 'PUT', `${GUESTS}/default/shop/services/apps/storefront`, guestService('apps', 'storefront'), 201);
    const svc = await eventually('the guest Service to get its address', async () => {
      const r = await call(server, 'GET', `${GUESTS}/default/shop/services/apps/storefront`);
      return r.json().status?.loadBalancer?.ingress?.[0]?.ip;
    });
    await ok(server, 'POST', LBS, mkLb('default', 'plain-vm'), 201);
    const vm = (await allocated(server, 'default', 'plain-vm')).status.allocatedAddress.ip;

    const page = await browser.page();
    await signIn(page, server);
    await waitForState(page, svc, 'allocated');
    await cell(page, svc).click();
    const owner = page.locator('[data-owner-of="pool1"] .owner-detail');
    await eventually('the owner panel', async () => (await owner.getAttribute('data-owner')) === svc);
    const text = await owner.textContent();
    assert.match(text, /allocated/);
    assert.match(text, /Guest cluster\s*shop \(namespace default\)/);
    assert.match(text, /Guest Service\s*apps\/storefront/);
    assert.match(text, /LoadBalancer\s*default\/shop-apps-storefront-/);
    assert.equal(await cell(page, svc).getAttribute('aria-pressed'), 'true');
    await screenshot(page, 'pools');

    // A VM load balancer's address has no guest cluster; a history address names its last holder.
    await cell(page, vm).click();
    await eventually('the VM owner', async () => (await owner.getAttribute('data-owner')) === vm);
    assert.match(await owner.textContent(), /LoadBalancer\s*default\/plain-vm/);
    assert.doesNotMatch(await owner.textContent(), /Guest cluster/);
    const historyIp = await page.locator('[data-pool="pool1"] button.cell[data-state="history"]').first().getAttribute('data-ip');
    await cell(page, historyIp).click();
    await eventually('the history owner', async () => (await owner.getAttribute('data-owner')) === historyIp);
    assert.match(await owner.textContent(), /Last held by default\/web-a, which gets it back first/);
    assert.match(await owner.textContent(), /does not exist now/);

    // By keyboard: one tab stop per map, arrows move, Enter chooses.
    await cell(page, vm).focus();
    await page.keyboard.press('ArrowLeft');
    const left = await page.evaluate(() => document.activeElement.dataset.ip);
    await page.keyboard.press('Enter');
    await eventually('the owner of the address to the left', async () => (await owner.getAttribute('data-owner')) === left);
    await page.keyboard.press('ArrowDown');
    const below = await page.evaluate(() => document.activeElement.dataset.ip);
    assert.equal(Number(below.split('.')[3]) - Number(left.split('.')[3]), 16);
    assert.equal(await page.locator('[data-pool="pool1"] button.cell[tabindex="0"]').count(), 1);

    // The owner links to the guest cluster's page, which shows the Service and its address.
    await cell(page, svc).click();
    await owner.getByRole('link', { name: /^shop \(namespace default\)$/ }).click();
    const cluster = page.locator('[data-cluster="default/shop"]');
    await cluster.waitFor();
    await eventually('the Service address on the guest page', async () =>
      (await cluster.locator('[data-address-of="apps/storefront"]').textContent()) === svc);
    await page.close();
  });

  test('load balancers: filters, conditions, Events and why one is not Ready', async () => {
    await ok(server, 'POST', LBS, mkLb('team-b', 'wants-missing', { ipPool: 'missing' }), 201);
    const page = await browser.page();
    await signIn(page, server);
    await page.getByRole('link', { name: 'Load balancers' }).click();
    await page.getByRole('heading', { level: 1, name: 'Load balancers' }).waitFor();
    const item = page.locator('details[data-lb="team-b/wants-missing"]');
    await item.waitFor();
    await eventually('its Not ready badge', async () => (await item.locator('summary .badge').textContent()) === 'Not ready');

    // Filter by state, then namespace; the filters stay in the address.
    await page.getByLabel('State').selectOption('not-ready');
    const names = () => page.locator('details[data-lb]').evaluateAll((ds) => ds.map((d) => d.dataset.lb));
    assert.deepEqual(await names(), ['team-b/wants-missing']);
    assert.match(page.url(), /state=not-ready/);
    await page.getByLabel('State').selectOption('');
    await page.getByLabel('Namespace').selectOption('default');
    assert.ok((await names()).every((n) => n.startsWith('default/')));
    assert.ok((await names()).includes('default/plain-vm'));
    await page.getByLabel('Namespace').selectOption('');
    await page.getByLabel('Pool').selectOption('big');
    assert.deepEqual(await names(), ['big/bulk']);
    await page.getByLabel('Pool').selectOption('');
    await page.getByLabel('Name or address').fill('wants');
    assert.deepEqual(await names(), ['team-b/wants-missing']);

    // Opened: why it is not Ready, its condition and its Events (from the Events route).
    await item.locator('summary').click();
    const why = item.locator('.why');
    await why.waitFor();
    assert.match(await why.textContent(), /Why it is not Ready: fail to get allocator missing/);
    await eventually('its NoMatchedIPPool Event', async () => /NoMatchedIPPool/.test(await item.locator('table').last().textContent()));
    assert.match(await item.locator('table').first().textContent(), /Ready\s*False\s*NoMatchedIPPool/);
    // Unfiltered again, it stays open among the others.
    await page.getByLabel('Name or address').fill('');
    await eventually('every load balancer listed', async () => (await names()).length >= 5);
    assert.equal(await item.evaluate((d) => d.open), true);
    await screenshot(page, 'loadbalancers');
    // It stays open and up to date across refreshes: a pool for it makes it Ready.
    await ok(server, 'POST', POOLS, mkPool('missing', '10.30.0.0/28', '10.30.0.2', '10.30.0.5',
      { selector: { scope: [{ namespace: 'team-b' }] } }), 201);
    await eventually('it to turn Ready', async () => (await item.locator('summary .badge').textContent()) === 'Ready');
    assert.equal(await item.evaluate((d) => d.open), true);
    await eventually('its Allocated Event', async () => /Allocated/.test(await item.locator('table').last().textContent()));
    assert.equal(await item.locator('.why').count(), 0);
    await page.close();
  });

  test('guest clusters: their Services, addresses and Events', async () => {
    // A secondary sharing the primary's address (which it has: the test before waited for it).
    await ok(server, 'PUT', `${GUESTS}/default/shop/services/apps/api`, guestService('apps', 'api', {
      annotations: { 'cloudprovider.harvesterhci.io/primary-service': 'apps/storefront' }, port: 8443,
    }), 201);
    const page = await browser.page();
    await signIn(page, server);
    await page.getByRole('link', { name: 'Guest clusters' }).click();
    const cluster = page.locator('[data-cluster="default/shop"]');
    await cluster.waitFor();
    const storefront = await cluster.locator('[data-address-of="apps/storefront"]').textContent();
    await eventually('the secondary to share the primary address', async () =>
      (await cluster.locator('[data-address-of="apps/api"]').textContent()) === storefront);
    assert.match(await cluster.textContent(), /apps\/api\s*LoadBalancer\s*[\d.]+\s*pool\s*apps\/storefront/);
    await eventually('an EnsuredLoadBalancer Event', async () => /EnsuredLoadBalancer/.test(await cluster.textContent()));
    await screenshot(page, 'guestclusters');
    // Any other cluster can be looked up; one without Services says so.
    await page.getByRole('textbox', { name: 'Namespace' }).fill('default');
    await page.getByRole('textbox', { name: 'Guest cluster' }).fill('empty-one');
    await page.getByRole('button', { name: 'Show' }).click();
    const none = page.locator('[data-cluster="default/empty-one"]');
    await none.waitFor();
    assert.match(await none.textContent(), /No Services/);
    await page.close();
  });

  test('a broken object shows once, as broken, and a failing request is asked again later and later', async () => {
    const labelled = (lb, cluster) => ({ ...lb, metadata: { ...lb.metadata, labels: { 'cloudprovider.harvesterhci.io/cluster': cluster } } });
    // A label Kubernetes refuses is refused here too, with the API server's message.
    const html = await call(server, 'POST', LBS, labelled(mkLb('default', 'html-label'), '<html>'));
    assert.equal(html.status, 422);
    assert.match(html.json().message, /metadata\.labels: Invalid value: "<html>": a valid label must be an empty string/);
    // A valid label value that no guest cluster can have: one broken load balancer, about which
    // the guest clusters API (which would answer 422) is never asked.
    await ok(server, 'POST', LBS, labelled(mkLb('default', 'odd-cluster'), 'Bad_Name'), 201);
    const page = await browser.page();
    const asked = [];
    page.on('request', (r) => { if (r.url().includes('/guestclusters/')) asked.push(new URL(r.url()).pathname); });
    await signIn(page, server);
    await page.getByRole('link', { name: 'Guest clusters' }).click();
    const broken = page.locator('[data-broken="default/odd-cluster"]');
    await broken.waitFor();
    assert.match(await broken.textContent(), /is "Bad_Name", which is not a guest cluster name/);
    const shop = page.locator('[data-cluster="default/shop"]');
    await shop.waitFor();
    assert.equal(await page.locator('[data-broken]').count(), 1);
    assert.equal(await page.locator('[data-cluster="default/Bad_Name"]').count(), 0);
    assert.deepEqual(asked.filter((p) => p.includes('Bad_Name')), []);
    // A cluster whose requests fail (the store failing, injected) is asked again after 2 s, 4 s,
    // 8 s…, not on every 2 s refresh: at most 3 times in a 10 s window (every 2 s would be 5).
    const services = `${GUESTS}/default/shop/services`;
    await page.route(`**${services}`, (route) => route.fulfill({
      status: 500, contentType: 'application/json', body: '{"type":"error","status":500,"code":"ServerError","message":"store failed"}',
    }));
    await eventually('the failure shown', async () => /500 ServerError: store failed/.test(await shop.textContent()));
    const failed = () => asked.filter((p) => p === services).length;
    const start = failed();
    // A window to count requests in, not a wait for a condition.
    await new Promise((r) => setTimeout(r, 10_000));
    const during = failed() - start;
    assert.ok(during <= 3, `the failing request was sent ${during} times in 10 s`);
    // Once it answers again, the cluster is shown again.
    await page.unroute(`**${services}`);
    await eventually('the cluster shown again', async () => /apps\/storefront/.test(await shop.textContent()));
    await page.close();
  });

  test('a cloud-config issued from the form is byte for byte the API answer, copied and downloaded', async () => {
    const page = await browser.page();
    await browser.context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: server.url });
    await signIn(page, server);
    await page.getByRole('link', { name: 'Cloud-configs' }).click();
    for (const [output, query, decode, file] of [
      ['Raw kubeconfig', '', (r) => JSON.parse(r.text), 'guest-one.kubeconfig'],
      ['Cloud-init user data', '&outputFormat=yaml', (r) => r.text, 'guest-one-cloud-init.yaml'],
    ]) {
      await page.getByLabel('Namespace', { exact: true }).first().fill('default');
      await page.getByLabel('Service account').first().fill('guest-one');
      await page.getByLabel(output).check();
      await page.getByRole('button', { name: 'Issue cloud-config' }).click();
      const pre = page.locator('#cloud-config-text');
      await eventually(`the ${output}`, async () => (await pre.getAttribute('aria-label'))?.startsWith(output));
      const shown = await pre.textContent();
      const api = await ok(server, 'GET', `${KUBECONFIG}?namespace=default&serviceAccountName=guest-one${query}`);
      const expected = decode(api);
      assert.ok(expected.length > 100);
      assert.equal(shown, expected, `${output}: shown as the API answers`);
      if (query) assert.match(shown, /^#+ cloud-init user data #+\nwrite_files:\n/);
      else assert.match(shown, /^apiVersion: v1\n/);

      await page.getByRole('button', { name: 'Copy' }).click();
      await page.getByText('Copied.').waitFor();
      assert.equal(await page.evaluate(() => navigator.clipboard.readText()), expected, `${output}: copied`);

      const [download] = await Promise.all([
        page.waitForEvent('download'),
        page.getByRole('button', { name: /^Download / }).click(),
      ]);
      assert.equal(download.suggestedFilename(), file);
      assert.deepEqual(readFileSync(await download.path()), Buffer.from(expected, 'utf8'), `${output}: downloaded`);
    }
    await screenshot(page, 'cloudconfigs');

    // A refused request says why.
    await page.getByLabel('Namespace', { exact: true }).first().fill('Not_A_Namespace');
    await page.getByRole('button', { name: 'Issue cloud-config' }).click();
    await page.getByText(/^Not issued: 422 InvalidBodyContent/).waitFor();

    // The list of every issued cloud-config has it, with its one token.
    const tokens = page.locator('[data-tokens-of="default/guest-one"] li');
    await eventually('guest-one in the list', async () => (await tokens.count()) === 1);
    assert.match(await tokens.first().textContent(), /^guest-one-token \(current\): no end$/);

    // Rotated from the list: the new cloud-config is shown as the API now answers it, and the old
    // token is listed as replaced, with the end of its grace.
    await page.getByLabel('Raw kubeconfig').check();
    await page.getByRole('button', { name: 'Rotate default/guest-one' }).click();
    await page.getByText(/^Rotated the token of default\/guest-one; the old token works for 1h more\.$/).waitFor();
    await eventually('two tokens listed', async () => (await tokens.count()) === 2);
    const after = JSON.parse((await ok(server, 'GET', `${KUBECONFIG}?namespace=default&serviceAccountName=guest-one`)).text);
    assert.equal(await page.locator('#cloud-config-text').textContent(), after, 'the rotated kubeconfig, as GET now answers');
    assert.match(await tokens.nth(0).textContent(), /^guest-one-token-[a-z0-9]{5} \(current\): no end$/);
    assert.match(await tokens.nth(1).textContent(), /^guest-one-token \(replaced\): until \d{4}-\d\d-\d\dT/);

    // Revoked from the list; the API no longer has it, nor the list.
    await page.getByRole('button', { name: 'Revoke default/guest-one…' }).click();
    await page.getByRole('button', { name: 'Revoke default/guest-one', exact: true }).click();
    await page.getByText('Revoked default/guest-one.').waitFor();
    assert.match(await page.locator('#revoke-form').textContent(), /Deleted: .*ServiceAccount default\/guest-one/i);
    assert.equal((await call(server, 'GET', `${KUBECONFIG}?namespace=default&serviceAccountName=guest-one`)).status, 404);
    await eventually('guest-one gone from the list', async () => (await tokens.count()) === 0);
    await page.close();
  });

  test('every page passes axe-core and fits a narrow window', async () => {
    for (const viewport of [{ width: 1280, height: 900 }, { width: 360, height: 740 }]) {
      const page = await browser.page();
      await page.setViewportSize(viewport);
      await page.goto(`${server.url}/ui/`);
      await page.getByLabel('Admin token').waitFor();
      assert.deepEqual(await accessibilityViolations(page), [], 'sign-in page');
      await signIn(page, server);
      for (const [link, ready] of [
        ['Pools', '[data-pool="pool1"]'],
        ['Load balancers', 'details[data-lb]'],
        ['Guest clusters', '[data-cluster]'],
        ['Cloud-configs', '#issue-form'],
      ]) {
        await page.getByRole('link', { name: link }).click();
        await page.locator(ready).first().waitFor();
        if (link === 'Load balancers') {
          await page.locator('details[data-lb] summary').first().click();
          await page.locator('details[open] .lb-body').waitFor();
        }
        assert.deepEqual(await accessibilityViolations(page), [], `${link} at ${viewport.width}px`);
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        assert.ok(overflow <= 0, `${link} at ${viewport.width}px is ${overflow}px too wide`);
        if (viewport.width < 400 && link === 'Pools') await screenshot(page, 'pools-narrow');
      }
      await page.close();
    }
  });

  test('loading, empty and error states', async () => {
    const fresh = await startServer();
    try {
      const page = await browser.page();
      // Loading: the pools page's first request is held until the test lets it go (the sign-in
      // check before it is not).
      let release;
      const held = new Promise((r) => { release = r; });
      let requests = 0;
      await page.route('**/loadbalancer.harvesterhci.io.ippools', async (route) => {
        if (requests++ === 1) await held;
        await route.continue();
      });
      await signIn(page, fresh);
      await page.getByText('Loading pools…').waitFor();
      release();
      // Empty.
      await page.getByText('No IP pools yet.').waitFor();
      await page.getByRole('link', { name: 'Load balancers' }).click();
      await page.getByText('No load balancers yet.').waitFor();
      await page.getByRole('link', { name: 'Guest clusters' }).click();
      await page.getByText('No guest cluster has a load balancer yet.').waitFor();
      // An error before any data: the page says what failed.
      await page.route('**/loadbalancer.harvesterhci.io.loadbalancers', (route) =>
        route.fulfill({ status: 500, contentType: 'application/json', body: '{"type":"error","status":500,"code":"ServerError","message":"store failed"}' }));
      await page.getByRole('link', { name: 'Load balancers' }).click();
      await page.getByText('Cannot load load balancers: 500 ServerError: store failed').waitFor();
      await page.unroute('**/loadbalancer.harvesterhci.io.loadbalancers');
      // An error after data: the last data stays, with the problem above it.
      await page.getByRole('link', { name: 'Pools' }).click();
      await page.getByText('No IP pools yet.').waitFor();
      await fresh.stop();
      await page.getByText(/Cannot refresh pools \(showing the last known\): The service could not be reached/).waitFor();
      assert.equal(await page.getByText('No IP pools yet.').isVisible(), true);
      await page.close();
    } finally {
      await fresh.stop().catch(() => {});
    }
  });

  test('nothing the console did raised a console error, a page error or a CSP violation', () => {
    // Errors the tests caused on purpose: the refused tokens (401), the refused namespace (422), the failed loads above.
    const unexpected = browser.problems.filter((p) => !/status of (401|422|500)|ERR_CONNECTION_REFUSED/.test(p));
    assert.deepEqual(unexpected, []);
  });
});
