// The documented HTTP API, called on the console's own origin with the admin token as a bearer
// token. The token lives in this tab's sessionStorage only: never in a cookie (requests send
// none: `credentials: 'omit'`) and never in a URL.

export const POOLS = '/v1/harvester/loadbalancer.harvesterhci.io.ippools';
export const LBS = '/v1/harvester/loadbalancer.harvesterhci.io.loadbalancers';
export const KUBECONFIG = '/v1/harvester/kubeconfig';
export const KUBECONFIGS = '/v1/harvester/kubeconfigs';
export const GUESTS = '/v1/harvester/guestclusters';

const TOKEN_KEY = 'harvester-cloud.token';

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (t) => sessionStorage.setItem(TOKEN_KEY, t),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

/** A path segment, escaped. */
export const seg = (s) => encodeURIComponent(s);

/** A refused or failed request: the API's error (`status`, `code`, `message`), or
 * `status` 0 when the service could not be reached. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }

  /** One sentence for a person. */
  describe() {
    if (this.status === 0) return `The service could not be reached (${this.message}).`;
    if (this.status === 401) {
      return `The service refused the token (401 Unauthorized): ${this.message}`;
    }
    if (this.status === 403) {
      return `The token is not allowed to do this (403 Forbidden): ${this.message}`;
    }
    return `${this.status} ${this.code}: ${this.message}`;
  }
}

export class Api {
  /** `onUnauthorized(error)` runs when the service refuses the token (401). */
  constructor(bearer, onUnauthorized = () => {}) {
    this.bearer = bearer;
    this.onUnauthorized = onUnauthorized;
  }

  /** `{status, contentType, text}` of a 2xx answer; an ApiError otherwise. */
  async request(method, path, body) {
    const headers = { Authorization: `Bearer ${this.bearer}`, Accept: 'application/json, application/x-yaml' };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let response;
    try {
      response = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: 'omit',
        cache: 'no-store',
        redirect: 'error',
      });
    } catch (e) {
      throw new ApiError(0, 'NetworkError', e.message);
    }
    const text = await response.text();
    if (!response.ok) {
      let error;
      try {
        const e = JSON.parse(text);
        error = new ApiError(response.status, e.code ?? response.statusText, e.message ?? text);
      } catch {
        error = new ApiError(response.status, response.statusText, text || response.statusText);
      }
      if (response.status === 401) this.onUnauthorized(error);
      throw error;
    }
    return { status: response.status, contentType: response.headers.get('content-type') ?? '', text };
  }

  async json(method, path, body) {
    const r = await this.request(method, path, body);
    return JSON.parse(r.text);
  }

  get(path) {
    return this.json('GET', path);
  }

  async pools() {
    return (await this.get(POOLS)).data ?? [];
  }

  async lbs() {
    return (await this.get(LBS)).data ?? [];
  }

  async lbEvents(namespace, name) {
    return (await this.get(`${LBS}/${seg(namespace)}/${seg(name)}/events`)).items ?? [];
  }

  async guestServices(namespace, cluster) {
    return (await this.get(`${GUESTS}/${seg(namespace)}/${seg(cluster)}/services`)).items ?? [];
  }

  async guestEvents(namespace, cluster) {
    return (await this.get(`${GUESTS}/${seg(namespace)}/${seg(cluster)}/events`)).items ?? [];
  }

  /** POST /v1/harvester/kubeconfig: the cloud-config exactly as the service wrote it (the raw
   * kubeconfig is a JSON string on the wire; cloud-init is YAML text). */
  async issueCloudConfig(namespace, serviceAccountName, cloudInit) {
    const body = { namespace, serviceAccountName };
    if (cloudInit) body.outputFormat = 'yaml';
    const r = await this.request('POST', KUBECONFIG, body);
    return cloudInit ? r.text : JSON.parse(r.text);
  }

  /** GET /v1/harvester/kubeconfigs, every page: the accounts this service issued. */
  async cloudConfigs() {
    const all = [];
    let next = `${KUBECONFIGS}?limit=1000`;
    for (;;) {
      const page = await this.get(next);
      all.push(...(page.data ?? []));
      if (!page.continue) return all;
      next = `${KUBECONFIGS}?limit=1000&continue=${seg(page.continue)}`;
    }
  }

  /** POST /v1/harvester/kubeconfig/rotate: the new cloud-config, as issueCloudConfig returns it. */
  async rotateCloudConfig(namespace, serviceAccountName, gracePeriod, cloudInit) {
    const body = { namespace, serviceAccountName, gracePeriod };
    if (cloudInit) body.outputFormat = 'yaml';
    const r = await this.request('POST', `${KUBECONFIG}/rotate`, body);
    return cloudInit ? r.text : JSON.parse(r.text);
  }

  /** DELETE /v1/harvester/kubeconfig: `{deleted, kept}`. */
  revokeCloudConfig(namespace, serviceAccountName) {
    const q = new URLSearchParams({ namespace, serviceAccountName });
    return this.json('DELETE', `${KUBECONFIG}?${q}`);
  }
}
