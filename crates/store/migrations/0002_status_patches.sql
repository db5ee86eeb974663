-- Status patches (JSON merge patches of `status`, RFC 7386) of an object since its row in `objects`
-- was written whole, applied in resource_version order when the store opens. A write of the whole
-- object (or its deletion) deletes them. An IP pool's status holds every allocation of the pool, and
-- an allocation round stores only what it changed here instead of rewriting the pool.
CREATE TABLE status_patches (
    api_version      TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    namespace        TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    resource_version INTEGER NOT NULL,
    patch            TEXT    NOT NULL,
    PRIMARY KEY (api_version, kind, namespace, name, resource_version)
) WITHOUT ROWID;
