-- Kubernetes-shaped objects of the embedded backend. `body` is the full JSON object, including
-- metadata.resourceVersion, which always equals `resource_version`.
CREATE TABLE objects (
    api_version      TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    namespace        TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    uid              TEXT    NOT NULL,
    resource_version INTEGER NOT NULL,
    body             TEXT    NOT NULL,
    PRIMARY KEY (api_version, kind, namespace, name)
) WITHOUT ROWID;

-- Store-wide counters: `resource_version` is the last version handed out (deletes consume one too).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('resource_version', '0');

-- Admin API tokens (`token-xxxxx:<secret>`). Only a salted hash of the secret is kept.
CREATE TABLE admin_tokens (
    name        TEXT PRIMARY KEY,
    hash        TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL,
    expires_at  TEXT,
    revoked_at  TEXT
) WITHOUT ROWID;

-- Service-account token signing keys (PKCS#8 PEM). The newest signs; all are published in the JWKS.
CREATE TABLE signing_keys (
    kid         TEXT PRIMARY KEY,
    private_pem TEXT NOT NULL,
    created_at  TEXT NOT NULL
) WITHOUT ROWID;
