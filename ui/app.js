// The console: sign-in, navigation between the pages (`#/<page>?<query>`), and live updates by
// polling the page shown every few seconds (paused while the tab is hidden).

import { Api, ApiError, POOLS, token } from './api.js';
import { poolsPage } from './pools.js';
import { loadBalancersPage } from './loadbalancers.js';
import { guestClustersPage } from './guests.js';
import { cloudConfigsPage } from './cloudconfigs.js';
import { retryDelay } from './model.js';

const PAGES = {
  pools: { title: 'Pools', make: poolsPage },
  loadbalancers: { title: 'Load balancers', make: loadBalancersPage },
  guestclusters: { title: 'Guest clusters', make: guestClustersPage },
  cloudconfigs: { title: 'Cloud-configs', make: cloudConfigsPage },
};
const DEFAULT_PAGE = 'pools';

const $ = (id) => document.getElementById(id);

let api = null;
let current = null;
let timer = null;
let generation = 0;
/** Failed refreshes in a row of the page shown: the next one waits longer (`retryDelay`). */
let failures = 0;

function route() {
  const hash = location.hash.startsWith('#/') ? location.hash.slice(2) : '';
  const [name, query = ''] = hash.split('?');
  return { name: PAGES[name] ? name : DEFAULT_PAGE, params: new URLSearchParams(query) };
}

function showSignIn(message) {
  stopPolling();
  current = null;
  $('page').replaceChildren();
  $('nav').hidden = true;
  $('session').hidden = true;
  $('signin').hidden = false;
  const error = $('signin-error');
  error.hidden = !message;
  error.textContent = message ?? '';
  $('token').setAttribute('aria-invalid', message ? 'true' : 'false');
  document.title = 'Sign in · harvester-cloud console';
  $('token').focus();
}

function signOut(message) {
  token.clear();
  api = null;
  showSignIn(message);
}

function refused(error) {
  signOut(`${error.describe()} Sign in again with a valid admin token.`);
}

function stopPolling() {
  generation++;
  failures = 0;
  clearTimeout(timer);
  timer = null;
}

/** Refreshes the page shown, then again after POLL_MS, or after a longer wait each time it
 * fails (2 s, 4 s, … up to a minute; back to POLL_MS once it succeeds) rather than asking a
 * failing service every 2 s. A page without `refresh` (a form, with nothing that changes by
 * itself) is not polled. `refresh` resolves to whether it got data. */
async function tick(gen) {
  if (gen !== generation || !current?.refresh) return;
  if (!document.hidden) {
    const fresh = await current.refresh();
    if (gen !== generation) return;
    failures = fresh ? 0 : failures + 1;
    if (fresh) $('updated').textContent = `Updated ${new Date().toLocaleTimeString()}`;
  }
  timer = setTimeout(() => tick(gen), retryDelay(failures));
}

function mount({ focus } = {}) {
  if (!api) return;
  stopPolling();
  const { name, params } = route();
  const page = PAGES[name];
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.page === name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = `${page.title} · harvester-cloud console`;
  current = page.make({ api, params });
  $('page').replaceChildren(current.el);
  $('updated').textContent = '';
  if (focus) current.el.querySelector('h1')?.focus();
  tick(generation);
}

function showConsole() {
  $('signin').hidden = true;
  $('nav').hidden = false;
  $('session').hidden = false;
  mount();
}

async function signIn(event) {
  event.preventDefault();
  const candidate = $('token').value.trim();
  if (!candidate) {
    showSignIn('Enter a token.');
    return;
  }
  const button = event.submitter ?? $('signin-form').querySelector('button');
  button.disabled = true;
  const probe = new Api(candidate);
  try {
    // Any authenticated read tells whether the service takes the token as an admin's.
    await probe.get(POOLS);
  } catch (e) {
    button.disabled = false;
    showSignIn(e instanceof ApiError ? e.describe() : String(e));
    return;
  }
  button.disabled = false;
  token.set(candidate);
  $('token').value = '';
  api = new Api(candidate, refused);
  showConsole();
  current?.el.querySelector('h1')?.focus();
}

function start() {
  $('signin-form').addEventListener('submit', signIn);
  $('signout').addEventListener('click', () => signOut(null));
  $('skip').addEventListener('click', (e) => {
    e.preventDefault();
    $('main').focus();
  });
  window.addEventListener('hashchange', () => {
    if (location.hash.startsWith('#/')) mount({ focus: true });
  });
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && current && timer) {
      clearTimeout(timer);
      tick(generation);
    }
  });
  const saved = token.get();
  if (saved) {
    api = new Api(saved, refused);
    showConsole();
  } else {
    showSignIn(null);
  }
}

start();
