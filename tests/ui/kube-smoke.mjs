// The console on the Kubernetes backend, as a smoke test: run by tests/console.rs, which leases a
// real control plane seeded like a Harvester cluster and passes the chart's service kubeconfig
// (CONSOLE_KUBECONFIG) and a Rancher admin's token (CONSOLE_TOKEN). This starts the real binary
// with `serve --backend kube` on it, and in Debian's chromium: a wrong token is refused; signed
// in, a pool shows with its load balancer's address and owner, the load balancer its Events,
// guest clusters say they are not kept here, and a cloud-config is issued as the API answers.
// Exits non-zero on any failure.

import assert from 'node:assert/strict';

import {
  KUBECONFIG, LBS, POOLS, allocated, eventually, launchBrowser, mkLb, mkPool, ok, signIn, startServer,
} from './support.mjs';

const kubeconfig = process.env.CONSOLE_KUBECONFIG;
const token = process.env.CONSOLE_TOKEN;
assert.ok(kubeconfig && token, 'CONSOLE_KUBECONFIG and CONSOLE_TOKEN must be set (tests/console.rs sets them)');

const server = await startServer(['--backend', 'kube', '--kubeconfig', kubeconfig, '--leader-elect=false'], { token });
const browser = await launchBrowser();
try {
  await ok(server, 'POST', POOLS, mkPool('kube-pool', '172.16.5.0/24', '172.16.5.20', '172.16.5.29'), 201);
  await ok(server, 'POST', LBS, mkLb('default', 'kube-lb'), 201);
  const ip = (await allocated(server, 'default', 'kube-lb')).status.allocatedAddress.ip;

  const page = await browser.page();
  await signIn(page, server, `${token.split(':')[0]}:wrong`);
  await page.locator('#signin-error').waitFor({ state: 'visible' });
  assert.match(await page.locator('#signin-error').textContent(), /refused the token \(401 Unauthorized\)/);

  await signIn(page, server);
  const card = page.locator('[data-pool="kube-pool"]');
  await card.waitFor();
  await eventually('the bar to count the load balancer', async () =>
    (await card.locator('.usage-text').getAttribute('data-usage')) === '1/10');
  const cell = card.locator(`button.cell[data-ip="${ip}"]`);
  await eventually(`${ip} allocated on the map`, async () => (await cell.getAttribute('data-state')) === 'allocated');
  await cell.click();
  await eventually('its owner', async () => /LoadBalancer\s*default\/kube-lb/.test(await card.locator('.owner').textContent()));

  await page.getByRole('link', { name: 'Load balancers' }).click();
  const item = page.locator('details[data-lb="default/kube-lb"]');
  await item.locator('summary').click();
  await eventually('its Allocated Event', async () => /Allocated/.test(await item.locator('.lb-body').textContent()));

  await page.getByRole('link', { name: 'Guest clusters' }).click();
  await page.getByText('No guest cluster has a load balancer yet.').waitFor();
  await page.getByRole('textbox', { name: 'Namespace' }).fill('default');
  await page.getByRole('textbox', { name: 'Guest cluster' }).fill('any');
  await page.getByRole('button', { name: 'Show' }).click();
  await page.getByText(/guest clusters are kept on the embedded backend only/).waitFor();

  await page.getByRole('link', { name: 'Cloud-configs' }).click();
  await page.getByLabel('Namespace', { exact: true }).first().fill('default');
  await page.getByLabel('Service account').first().fill('kube-guest');
  await page.getByRole('button', { name: 'Issue cloud-config' }).click();
  const pre = page.locator('#cloud-config-text');
  await pre.waitFor();
  const api = await ok(server, 'GET', `${KUBECONFIG}?namespace=default&serviceAccountName=kube-guest`);
  assert.equal(await pre.textContent(), JSON.parse(api.text));
  console.log('the console works on the Kubernetes backend');
} finally {
  await browser.close();
  await server.stop();
}
