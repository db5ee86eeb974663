// What the console's browser tests share: the real binary started on a fresh embedded store,
// the API called as a client would, Debian's chromium driven headless by playwright-core, and
// polling for a condition (never a fixed sleep).

import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const SCREENSHOTS = join(ROOT, 'docs/src/screenshots');
export const POOLS = '/v1/harvester/loadbalancer.harvesterhci.io.ippools';
export const LBS = '/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers';
export const KUBECONFIG = '/v1/harvester/kubeconfig';
export const GUESTS = '/v1/harvester/guestclusters';
/** How long a condition may take before the test gives up; not a performance bound. */
export const PATIENCE_MS = 60_000;
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';

/** The binary under test: $HARVESTER_CLOUD_BIN, else the debug build of the target dir. */
export function binary() {
  if (process.env.HARVESTER_CLOUD_BIN) return process.env.HARVESTER_CLOUD_BIN;
  const target = process.env.CARGO_TARGET_DIR ? resolve(ROOT, process.env.CARGO_TARGET_DIR) : join(ROOT, 'target');
  return join(target, 'debug/harvester-cloud');
}

/**
 * Starts `harvester-cloud serve --http` on a free loopback port and a fresh data directory, with
 * `extra` arguments (e.g. `--backend kube …`). Resolves once it logs that it listens; the admin
 * token is `token`, else the one the embedded store wrote. `stop()` sends SIGTERM and waits for
 * a clean exit.
 */
export async function startServer(extra = [], { token: given } = {}) {
  const bin = binary();
  if (!existsSync(bin)) throw new Error(`${bin} does not exist: run cargo build first`);
  const dir = mkdtempSync(join(tmpdir(), 'hc-console-'));
  const child = spawn(bin, [
    '--data-dir', join(dir, 'data'), '--log-format', 'json',
    'serve', '--http', '--listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0', '--vip', '10.0.0.1',
    ...extra,
  ], { stdio: ['ignore', 'ignore', 'pipe'] });
  const log = [];
  const exited = new Promise((res) => child.once('exit', (code, signal) => res({ code, signal })));
  const url = await new Promise((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`the server did not listen in time:\n${log.join('\n')}`)), PATIENCE_MS);
    createInterface({ input: child.stderr }).on('line', (line) => {
      log.push(line);
      let v;
      try { v = JSON.parse(line); } catch { return; }
      if (typeof v.message === 'string' && v.message.startsWith('listening') && v.url) {
        clearTimeout(timer);
        res(v.url);
      }
    });
    exited.then(({ code }) => { clearTimeout(timer); rej(new Error(`the server exited (${code}):\n${log.join('\n')}`)); });
  }).catch((e) => { child.kill('SIGKILL'); rmSync(dir, { recursive: true, force: true }); throw e; });
  const token = given ?? readFileSync(join(dir, 'data/admin-token'), 'utf8').trim();
  return {
    url,
    token,
    log,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const { code, signal } = await exited;
      rmSync(dir, { recursive: true, force: true });
      if (code !== 0) throw new Error(`the server did not exit cleanly (${code ?? signal}):\n${log.slice(-20).join('\n')}`);
    },
  };
}

/** Calls the API as a client does: `{status, headers, text, json()}`. */
export async function call(server, method, path, body, { token = server.token } = {}) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(server.url + path, {
    method, headers, body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, headers: r.headers, text, json: () => JSON.parse(text) };
}

/** `call`, failing unless the status is `want`. */
export async function ok(server, method, path, body, want = 200) {
  const r = await call(server, method, path, body);
  if (r.status !== want) throw new Error(`${method} ${path}: ${r.status} ${r.text}`);
  return r;
}

/** Polls `probe` (every 50 ms) until it returns something other than undefined/false/null. */
export async function eventually(what, probe) {
  const deadline = Date.now() + PATIENCE_MS;
  let last;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined && v !== false && v !== null) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}${last ? `: ${last.message}` : ''}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export function mkPool(name, subnet, rangeStart, rangeEnd, extra = {}) {
  return {
    apiVersion: 'loadbalancer.harvesterhci.io/v1beta1',
    kind: 'IPPool',
    metadata: { name },
    spec: {
      ranges: [{ subnet, rangeStart, rangeEnd }],
      selector: { scope: [{ project: '*', namespace: '*', guestCluster: '*' }] },
      ...extra,
    },
  };
}

export function mkLb(namespace, name, spec = {}) {
  return {
    apiVersion: 'loadbalancer.harvesterhci.io/v1beta1',
    kind: 'LoadBalancer',
    metadata: { name, namespace },
    // `cluster`: an address and nothing else, Ready once allocated. A `vm` load balancer (the
    // default) is Ready only with backends, and on Kubernetes once kube-vip announces it
    // (tests/vm_lb.rs covers those).
    spec: {
      ipam: 'pool', workloadType: 'cluster', listeners: [{ name: 'http', port: 80, protocol: 'TCP', backendPort: 8080 }], ...spec,
    },
  };
}

/** Waits until a load balancer is Ready with an address, and returns it. */
export async function allocated(server, namespace, name) {
  return eventually(`${namespace}/${name} to get an address`, async () => {
    const r = await call(server, 'GET', `${LBS}/${namespace}/${name}`);
    if (r.status !== 200) return null;
    const lb = r.json();
    const ready = (lb.status?.conditions ?? []).find((c) => c.type === 'Ready');
    return ready?.status === 'True' && lb.status?.allocatedAddress?.ip ? lb : null;
  });
}

/**
 * A headless chromium with its own fresh profile. `page()` opens a page that records console
 * errors and page errors (a CSP violation is one); `problems` lists them.
 */
export async function launchBrowser({ viewport = { width: 1280, height: 900 } } = {}) {
  const profile = mkdtempSync(join(tmpdir(), 'hc-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport,
    acceptDownloads: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
  const problems = [];
  const watch = (page) => {
    page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    return page;
  };
  context.on('page', watch);
  for (const p of context.pages()) watch(p);
  return {
    context,
    problems,
    async page() {
      const existing = context.pages().find((p) => p.url() === 'about:blank');
      return existing ?? context.newPage();
    },
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** Opens the console and signs in with `token`. */
export async function signIn(page, server, token = server.token) {
  await page.goto(`${server.url}/ui/`);
  await page.getByLabel('Admin token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
}

/** Saves a screenshot of the page for the manual (docs/src/console.md). */
export async function screenshot(page, name) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true, animations: 'disabled' });
}

/** Runs axe-core (WCAG 2.1 A/AA rules) on the page and returns its violations. */
export async function accessibilityViolations(page) {
  const source = readFileSync(join(ROOT, 'tests/ui/node_modules/axe-core/axe.min.js'), 'utf8');
  // Evaluated through the DevTools protocol, which the page's CSP does not govern.
  await page.evaluate(source);
  const result = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(' ')).slice(0, 5) }));
  });
  return result;
}
