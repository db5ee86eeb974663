// The Cloud-configs page: issue a guest cluster's cloud-config (POST /v1/harvester/kubeconfig:
// the raw kubeconfig, or cloud-init user data), shown exactly as the service wrote it, with a copy
// button and a download; every cloud-config the service issued (GET /v1/harvester/kubeconfigs)
// with its bindings and tokens, to rotate (POST …/rotate, with a grace for the old token) or
// revoke (DELETE). The text is kept in this page only: it is never stored.

import { facts, h, replace, table, time } from './dom.js';

const OUTPUTS = {
  kubeconfig: {
    label: 'Raw kubeconfig',
    hint: 'for /etc/kubernetes/cloud-config, or the cloud provider’s and the ccm’s --cloud-config',
    type: 'application/yaml',
    file: (sa) => `${sa}.kubeconfig`,
  },
  'cloud-init': {
    label: 'Cloud-init user data',
    hint: 'writes the kubeconfig to /etc/kubernetes/cloud-config and the RKE2 path',
    type: 'application/x-yaml',
    file: (sa) => `${sa}-cloud-init.yaml`,
  },
};

function field(id, label, hint, input) {
  if (hint) input.setAttribute('aria-describedby', `${id}-hint`);
  return h('div', { class: 'field' },
    h('label', { for: id }, label),
    input,
    hint ? h('p', { class: 'hint', id: `${id}-hint` }, hint) : null);
}

function textInput(id, name) {
  return h('input', { id, name, required: true, autocomplete: 'off', spellcheck: 'false', maxlength: '253' });
}

export function cloudConfigsPage({ api }) {
  const status = h('p', { class: 'form-status', role: 'status' });
  const result = h('div', { class: 'result', id: 'cloud-config-result' });
  // Every account the service issued, refreshed after each change made here.
  const issuedList = h('div', { id: 'issued-list' });

  const namespace = textInput('cc-namespace', 'namespace');
  const account = textInput('cc-account', 'serviceAccountName');
  const output = h('fieldset', null,
    h('legend', null, 'Output'),
    Object.entries(OUTPUTS).map(([value, o], i) => h('div', { class: 'choice' },
      h('input', { type: 'radio', name: 'output', id: `cc-output-${value}`, value, checked: i === 0 }),
      h('label', { for: `cc-output-${value}` }, o.label, h('span', { class: 'hint' }, ` (${o.hint})`)))));
  const issueButton = h('button', { type: 'submit' }, 'Issue cloud-config');
  const form = h('form', { class: 'stack', id: 'issue-form', 'aria-labelledby': 'issue-title', onsubmit: issue, novalidate: true },
    field('cc-namespace', 'Namespace', 'The guest cluster’s VM namespace (an RFC 1123 label, e.g. default).', namespace),
    field('cc-account', 'Service account', 'Usually the guest cluster’s name (an RFC 1123 subdomain).', account),
    output,
    h('div', { class: 'actions' }, issueButton),
    status);

  const revokeStatus = h('div', { class: 'form-status', role: 'status' });
  const revokeNamespace = textInput('rv-namespace', 'namespace');
  const revokeAccount = textInput('rv-account', 'serviceAccountName');
  const confirm = h('div', { class: 'confirm', hidden: true });
  const revokeForm = h('form', { class: 'stack', id: 'revoke-form', 'aria-labelledby': 'revoke-title', onsubmit: askRevoke, novalidate: true },
    field('rv-namespace', 'Namespace', null, revokeNamespace),
    field('rv-account', 'Service account', null, revokeAccount),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'danger' }, 'Revoke…')),
    confirm,
    revokeStatus);

  const el = h('div', { class: 'page cloudconfigs' },
    h('h1', { tabindex: '-1' }, 'Cloud-configs'),
    h('p', { class: 'lead' }, 'A cloud-config gives a guest cluster’s cloud provider its own service account on this cluster. '
      + 'Issuing one again returns the same account’s cloud-config.'),
    h('div', { class: 'columns' },
      h('section', { class: 'card', 'aria-labelledby': 'issue-title' }, h('h2', { id: 'issue-title' }, 'Issue'), form),
      h('section', { class: 'card', 'aria-labelledby': 'revoke-title' },
        h('h2', { id: 'revoke-title' }, 'Revoke'),
        h('p', null, 'Deletes the account’s bindings, token Secrets and ServiceAccount: the guest cluster’s cloud provider loses its access.'),
        revokeForm)),
    result,
    h('section', { class: 'card', 'aria-labelledby': 'issued-title', id: 'issued-cloud-configs' },
      h('h2', { id: 'issued-title' }, 'Issued cloud-configs'),
      h('p', { class: 'hint' }, 'Rotating gives the account a new token, shown below like an issued one; the old token keeps working for the grace chosen, then stops. '
        + 'Only the newest two tokens of an account ever work.'),
      issuedList));

  function tokenText(t) {
    const ends = t.expiresAt ? `until ${t.expiresAt}` : 'no end';
    return `${t.secret}${t.current ? ' (current)' : ' (replaced)'}: ${ends}`;
  }

  function bindingText(b) {
    if (!b.exists) return 'missing';
    return b.ours ? 'ok' : `not the account’s${b.reason ? ` (${b.reason})` : ''}`;
  }

  async function renderIssued() {
    let accounts;
    try {
      accounts = await api.cloudConfigs();
    } catch (e) {
      replace(issuedList, h('p', { class: 'form-status error' }, `Could not list the cloud-configs: ${e.describe ? e.describe() : e}`));
      return;
    }
    if (accounts.length === 0) {
      replace(issuedList, h('p', { class: 'hint' }, 'None yet.'));
      return;
    }
    replace(issuedList, table('Issued cloud-configs', ['Account', 'Guest cluster', 'Created', 'Bindings', 'Tokens', 'Actions'],
      accounts.map((a) => {
        const key = `${a.namespace}/${a.serviceAccount}`;
        const grace = h('select', { 'aria-label': `Grace for the old token of ${key}` },
          [['1h', 'old token works 1 h more'], ['30m', 'old token works 30 min more'], ['0', 'old token stops now']]
            .map(([value, label]) => h('option', { value }, label)));
        return [
          key,
          a.guestCluster ?? '—',
          time(a.created),
          `RoleBinding ${bindingText(a.bindings.roleBinding)}; ClusterRoleBinding ${bindingText(a.bindings.clusterRoleBinding)}`,
          a.tokens.length ? h('ul', { class: 'plain', 'data-tokens-of': key }, a.tokens.map((t) => h('li', null, tokenText(t)))) : 'none',
          h('div', { class: 'actions' },
            grace,
            h('button', { type: 'button', class: 'secondary', onclick: () => rotate(a.namespace, a.serviceAccount, grace.value) }, `Rotate ${key}`),
            h('button', {
              type: 'button', class: 'secondary',
              onclick: () => {
                revokeNamespace.value = a.namespace;
                revokeAccount.value = a.serviceAccount;
                askRevoke();
              },
            }, `Revoke ${key}…`)),
        ];
      }), { captionHidden: true }));
  }

  async function rotate(ns, sa, gracePeriod) {
    const kind = form.querySelector('input[name=output]:checked')?.value ?? 'kubeconfig';
    status.className = 'form-status';
    status.textContent = `Rotating the token of ${ns}/${sa}…`;
    try {
      const text = await api.rotateCloudConfig(ns, sa, gracePeriod, kind === 'cloud-init');
      status.textContent = `Rotated the token of ${ns}/${sa}${gracePeriod === '0' ? '; the old token stopped' : `; the old token works for ${gracePeriod} more`}.`;
      showResult(ns, sa, kind, text);
      result.querySelector('h2')?.focus();
      await renderIssued();
    } catch (e) {
      status.className = 'form-status error';
      status.textContent = `Not rotated: ${e.describe ? e.describe() : e}`;
    }
  }

  function showResult(ns, sa, kind, text) {
    const o = OUTPUTS[kind];
    const copyStatus = h('span', { class: 'copy-status', role: 'status' });
    const pre = h('pre', { id: 'cloud-config-text', tabindex: '0', 'aria-label': `${o.label} of ${ns}/${sa}` }, text);
    const copy = async () => {
      try {
        await navigator.clipboard.writeText(text);
        copyStatus.textContent = 'Copied.';
      } catch {
        // No clipboard (an insecure origin, or refused): select the text for the reader to copy.
        const range = document.createRange();
        range.selectNodeContents(pre);
        getSelection().removeAllRanges();
        getSelection().addRange(range);
        pre.focus();
        copyStatus.textContent = 'Copying was refused: the text is selected, press Ctrl+C (⌘C) to copy it.';
      }
    };
    const download = () => {
      const url = URL.createObjectURL(new Blob([text], { type: o.type }));
      const a = h('a', { href: url, download: o.file(sa), hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    };
    replace(result, h('section', { class: 'card', 'aria-labelledby': 'result-title' },
      h('h2', { id: 'result-title', tabindex: '-1' }, `Cloud-config of ${ns}/${sa}`),
      facts([['Output', `${o.label} (${o.hint})`], ['Size', `${new TextEncoder().encode(text).length} bytes`]]),
      h('div', { class: 'actions' },
        h('button', { type: 'button', id: 'copy-cloud-config', onclick: copy }, 'Copy'),
        h('button', { type: 'button', id: 'download-cloud-config', class: 'secondary', onclick: download }, `Download ${o.file(sa)}`),
        copyStatus),
      pre));
  }

  async function issue(event) {
    event.preventDefault();
    const ns = namespace.value.trim();
    const sa = account.value.trim();
    const kind = form.querySelector('input[name=output]:checked')?.value ?? 'kubeconfig';
    if (!ns || !sa) {
      status.className = 'form-status error';
      status.textContent = 'Enter a namespace and a service account.';
      (ns ? account : namespace).focus();
      return;
    }
    issueButton.disabled = true;
    status.className = 'form-status';
    status.textContent = `Issuing the cloud-config of ${ns}/${sa}…`;
    try {
      const text = await api.issueCloudConfig(ns, sa, kind === 'cloud-init');
      status.textContent = `Issued the cloud-config of ${ns}/${sa}.`;
      showResult(ns, sa, kind, text);
      renderIssued();
      result.querySelector('h2')?.focus();
    } catch (e) {
      status.className = 'form-status error';
      status.textContent = `Not issued: ${e.describe ? e.describe() : e}`;
    } finally {
      issueButton.disabled = false;
    }
  }

  function askRevoke(event) {
    event?.preventDefault();
    const ns = revokeNamespace.value.trim();
    const sa = revokeAccount.value.trim();
    if (!ns || !sa) {
      revokeStatus.className = 'form-status error';
      revokeStatus.textContent = 'Enter the namespace and service account to revoke.';
      return;
    }
    revokeStatus.textContent = '';
    const yes = h('button', { type: 'button', class: 'danger', id: 'confirm-revoke', onclick: () => revoke(ns, sa) }, `Revoke ${ns}/${sa}`);
    const no = h('button', { type: 'button', class: 'secondary', onclick: () => { confirm.hidden = true; } }, 'Cancel');
    replace(confirm, h('p', null, `Revoke the cloud-config of ${ns}/${sa}? Its guest cluster loses access to this cluster.`), h('div', { class: 'actions' }, yes, no));
    confirm.hidden = false;
    yes.focus();
  }

  async function revoke(ns, sa) {
    confirm.hidden = true;
    revokeStatus.className = 'form-status';
    revokeStatus.textContent = `Revoking ${ns}/${sa}…`;
    try {
      const r = await api.revokeCloudConfig(ns, sa);
      renderIssued();
      replace(revokeStatus,
        h('p', null, r.deleted.length ? `Revoked ${ns}/${sa}.` : `${ns}/${sa} had nothing to revoke.`),
        r.deleted.length ? h('p', null, 'Deleted: ', r.deleted.join(', ')) : null,
        r.kept.length ? h('p', null, 'Kept (not the account’s): ', r.kept.map((k) => `${k.object} (${k.reason})`).join(', ')) : null);
    } catch (e) {
      revokeStatus.className = 'form-status error';
      revokeStatus.textContent = `Not revoked: ${e.describe ? e.describe() : e}`;
    }
  }

  renderIssued();
  // Nothing here changes by itself: no `refresh`, so the page is not polled.
  return { el };
}
