// Building the page from data with DOM calls only: no HTML strings anywhere (the
// Content-Security-Policy's Trusted Types make the browser refuse them), so nothing the API
// returns can become markup.

/**
 * `h('a', {href: '#/pools', class: 'x', onclick: f}, 'text', child)`: an element with attributes
 * (`class`, `text`, `on<event>` handlers; `true` for a bare attribute; null/false/undefined are
 * left out) and children (strings become text nodes; arrays are flattened).
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

/** Replaces an element's children, keeping keyboard focus on the element of the same
 * `data-key` when the one focused is rebuilt. */
export function replace(el, ...children) {
  const focused = document.activeElement;
  const key = focused && el.contains(focused) ? focused.dataset?.key : undefined;
  el.replaceChildren();
  append(el, children);
  if (key !== undefined) {
    const again = [...el.querySelectorAll('[data-key]')].find((e) => e.dataset.key === key);
    again?.focus({ preventScroll: true });
  }
}

/** A loading state. */
export function loading(what) {
  return h('p', { class: 'state loading', role: 'status' }, `Loading ${what}…`);
}

/** An empty state: a sentence and what to do about it. */
export function empty(...children) {
  return h('div', { class: 'state empty' }, ...children);
}

/** An error state, read out when it appears. */
export function failure(what, error) {
  return h('div', { class: 'state error', role: 'alert' },
    h('strong', null, `Cannot load ${what}: `),
    error?.describe ? error.describe() : String(error?.message ?? error));
}

/** `<code>` text. */
export function code(text) {
  return h('code', null, text);
}

/** A description list from `[term, value]` pairs (pairs with an empty value are left out). */
export function facts(pairs) {
  return h('dl', { class: 'facts' },
    pairs.filter(([, v]) => v !== '' && v !== null && v !== undefined && !(Array.isArray(v) && v.length === 0))
      .map(([t, v]) => h('div', null, h('dt', null, t), h('dd', null, v))));
}

/** A table with a caption, column headings and rows of cells (strings or nodes). */
export function table(caption, headings, rows, { captionHidden = false } = {}) {
  // The wrapper scrolls a wide table sideways in a narrow window, so it takes keyboard focus.
  return h('div', { class: 'table-wrap', role: 'region', tabindex: '0', 'aria-label': caption },
    h('table', null,
      h('caption', { class: captionHidden ? 'visually-hidden' : null }, caption),
      h('thead', null, h('tr', null, headings.map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', null, rows.map((cells) => h('tr', null, cells.map((c) => h('td', null, c)))))));
}

/** A time as the reader's locale writes it, with the exact value in a `<time>`. */
export function time(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return h('time', { datetime: iso }, d.toLocaleString());
}

/** A stable, attribute-safe id fragment for a name. */
export function slug(text) {
  return String(text).replace(/[^A-Za-z0-9_-]/g, (c) => `_${c.charCodeAt(0).toString(16)}`);
}

/**
 * A view of data that is refreshed: loading until the first answer; then the data, with a
 * problem above it when a later refresh fails (the last data stays shown); or the error alone
 * when there never was data.
 */
export function liveView(what) {
  const problem = h('div', { class: 'problem' });
  const body = h('div', { class: 'view' }, loading(what));
  let shown = false;
  let problemText = '';
  const view = {
    nodes: [problem, body],
    body,
    show(...children) {
      shown = true;
      problemText = '';
      problem.replaceChildren();
      replace(body, ...children);
    },
    fail(error) {
      const text = error?.describe ? error.describe() : String(error?.message ?? error);
      if (!shown) {
        replace(body, failure(what, error));
        return;
      }
      // Only a new problem is announced again, not every failed refresh.
      if (text === problemText) return;
      problemText = text;
      replace(problem, h('div', { class: 'state error', role: 'alert' },
        h('strong', null, `Cannot refresh ${what} (showing the last known): `), text));
    },
    /**
     * A page's `refresh`: `load()` fetches, `draw(data)` renders when that differs from what was
     * drawn last (compared as JSON), a failure is shown with `fail`. Resolves to whether it got
     * data.
     */
    refresher(load, draw) {
      let drawn = null;
      return async () => {
        try {
          const data = await load();
          const text = JSON.stringify(data);
          if (text !== drawn) {
            drawn = text;
            draw(data);
          }
          return true;
        } catch (e) {
          drawn = null;
          view.fail(e);
          return false;
        }
      };
    },
  };
  return view;
}
