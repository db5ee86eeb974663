//! The objects that make up a cloud-config account, shaped as Harvester creates them, and the checks
//! that decide whether an existing object of the same name is ours to reuse.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::{
        core::v1::{Secret, ServiceAccount},
        rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};

use super::{
    naming::AccountNames,
    request::{CLOUDPROVIDER_ROLE, CSI_DRIVER_ROLE},
};

pub use crate::crd::keys::{MANAGED_BY, MANAGED_BY_LABEL};
pub const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
pub const SA_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
pub const SA_UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";
/// On our ClusterRoleBinding, which has no owner reference: the UID of the ServiceAccount it is for.
pub const BINDING_SA_UID_ANNOTATION: &str = "harvester-cloud.io/serviceaccount-uid";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// On our ServiceAccount, once its token was rotated: the name of the token Secret whose token is
/// the account's current one (without it, `<serviceAccount>-token`, as Harvester names it).
pub(crate) const TOKEN_SECRET_ANNOTATION: &str = "harvester-cloud.io/token-secret";
/// On a token Secret: when its token stops working (RFC 3339, UTC), by its `expirationSeconds` or
/// at the end of a rotation's grace period. The sweeper deletes the Secret then.
pub const EXPIRES_AT_ANNOTATION: &str = "harvester-cloud.io/expires-at";
/// On a token Secret that a rotation replaced: when (RFC 3339, UTC).
pub(crate) const ROTATED_AT_ANNOTATION: &str = "harvester-cloud.io/rotated-at";
/// On a token Secret a rotation made and has not made current yet: when it stops working if it
/// never becomes current (RFC 3339, UTC), so a rotation that dies before its switch leaves no
/// third token behind. Not [`EXPIRES_AT_ANNOTATION`]: a token's end is minted into it (a JWT's
/// `exp`), and this one must not end once it is current.
pub(crate) const PROVISIONAL_UNTIL_ANNOTATION: &str = "harvester-cloud.io/provisional-until";
/// On a ServiceAccount, written in the same write as a rotation's switch: the token Secret it
/// replaced, to keep working until [`REPLACED_UNTIL_ANNOTATION`] and no longer, even if the
/// rotation stops before it marks that Secret.
pub(crate) const REPLACED_TOKEN_ANNOTATION: &str = "harvester-cloud.io/replaced-token-secret";
/// See [`REPLACED_TOKEN_ANNOTATION`]: the end of the replaced token's grace (RFC 3339, UTC).
pub(crate) const REPLACED_UNTIL_ANNOTATION: &str = "harvester-cloud.io/replaced-token-until";
/// On a ServiceAccount while a rotation of it is under way: until when that rotation holds the
/// account (RFC 3339, UTC; the provisional end of the token it makes). Another rotation before
/// then is a conflict; the rotation's switch removes it in the same write, and one that stops
/// before leaves it to lapse.
pub const ROTATING_UNTIL_ANNOTATION: &str = "harvester-cloud.io/rotating-until";
/// On a token Secret issued with `expirationSeconds`: that lifetime, so a retried request for the
/// same lifetime gets the same token.
pub(crate) const EXPIRATION_SECONDS_ANNOTATION: &str = "harvester-cloud.io/expiration-seconds";

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whole seconds, as a JWT's `exp` and Kubernetes' timestamps are, so a token's claim and its
/// Secret's end agree to the second.
pub(crate) fn rfc3339(t: time::OffsetDateTime) -> String {
    t.replace_nanosecond(0)
        .unwrap_or(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// When a token Secret's token stops working, if it has an end.
pub fn expires_at(secret: &Secret) -> Option<time::OffsetDateTime> {
    annotation(&secret.metadata, EXPIRES_AT_ANNOTATION).and_then(parse_end)
}

/// The value of [`EXPIRES_AT_ANNOTATION`] as a time (`None` when it is not RFC 3339).
pub(crate) fn parse_end(value: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339).ok()
}

/// When a token Secret a rotation made stops working unless the rotation makes it current.
pub(crate) fn provisional_until(secret: &Secret) -> Option<time::OffsetDateTime> {
    annotation(&secret.metadata, PROVISIONAL_UNTIL_ANNOTATION).and_then(parse_end)
}

/// Gives a rotation's new token Secret its provisional end.
pub(crate) fn set_provisional(secret: &mut Secret, until: time::OffsetDateTime) {
    secret
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(PROVISIONAL_UNTIL_ANNOTATION.into(), rfc3339(until));
}

/// Removes the provisional end of a token Secret that became current; whether it had one.
pub(crate) fn clear_provisional(secret: &mut Secret) -> bool {
    secret
        .metadata
        .annotations
        .as_mut()
        .is_some_and(|a| a.remove(PROVISIONAL_UNTIL_ANNOTATION).is_some())
}

/// Whether a rotation replaced this token Secret (it is never current again).
pub(crate) fn is_retired(secret: &Secret) -> bool {
    annotation(&secret.metadata, ROTATED_AT_ANNOTATION).is_some()
}

/// The token Secret the account's last rotation replaced, and the end of its grace.
pub(crate) fn replaced_token(sa: &ServiceAccount) -> Option<(&str, time::OffsetDateTime)> {
    let name = annotation(&sa.metadata, REPLACED_TOKEN_ANNOTATION)?;
    let until = annotation(&sa.metadata, REPLACED_UNTIL_ANNOTATION).and_then(parse_end)?;
    Some((name, until))
}

/// Records on the ServiceAccount which token a rotation replaces and until when it works (or
/// that none keeps working: `None`).
pub(crate) fn set_replaced(
    sa: &mut ServiceAccount,
    replaced: Option<(&str, time::OffsetDateTime)>,
) {
    let a = sa.metadata.annotations.get_or_insert_default();
    match replaced {
        Some((name, until)) => {
            a.insert(REPLACED_TOKEN_ANNOTATION.into(), name.into());
            a.insert(REPLACED_UNTIL_ANNOTATION.into(), rfc3339(until));
        }
        None => {
            a.remove(REPLACED_TOKEN_ANNOTATION);
            a.remove(REPLACED_UNTIL_ANNOTATION);
        }
    }
}

/// Until when a rotation holds the account, if one claimed it (the time may have passed).
pub(crate) fn rotating_until(sa: &ServiceAccount) -> Option<time::OffsetDateTime> {
    annotation(&sa.metadata, ROTATING_UNTIL_ANNOTATION).and_then(parse_end)
}

/// Records a rotation's claim on the ServiceAccount until `until`, or removes it (`None`).
pub(crate) fn set_rotating(sa: &mut ServiceAccount, until: Option<time::OffsetDateTime>) {
    match until {
        Some(until) => {
            sa.metadata
                .annotations
                .get_or_insert_default()
                // To the nanosecond: the value tells one rotation's claim from another's (a
                // rotation whose claim write failed looks for its own; see `lifecycle`).
                .insert(
                    ROTATING_UNTIL_ANNOTATION.into(),
                    until
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default(),
                );
        }
        None => {
            if let Some(a) = sa.metadata.annotations.as_mut() {
                a.remove(ROTATING_UNTIL_ANNOTATION);
            }
        }
    }
}

/// Whether a token Secret's end has come.
pub(crate) fn has_ended(secret: &Secret) -> bool {
    expires_at(secret).is_some_and(|end| end <= time::OffsetDateTime::now_utc())
}

/// Gives a new token Secret its lifetime: it stops working `lifetime` after `now`.
pub(crate) fn set_lifetime(
    secret: &mut Secret,
    lifetime: std::time::Duration,
    now: time::OffsetDateTime,
) {
    let a = secret.metadata.annotations.get_or_insert_default();
    a.insert(EXPIRES_AT_ANNOTATION.into(), rfc3339(now + lifetime));
    a.insert(
        EXPIRATION_SECONDS_ANNOTATION.into(),
        lifetime.as_secs().to_string(),
    );
}

/// Marks a token Secret as replaced at `now`, working until `until` (or its own end, if sooner).
/// A provisional end left on it (its rotation stopped after its switch) goes: it was current, and
/// its grace is its end now.
pub(crate) fn set_retiring(
    secret: &mut Secret,
    now: time::OffsetDateTime,
    until: time::OffsetDateTime,
) {
    let end = expires_at(secret).map_or(until, |e| e.min(until));
    let a = secret.metadata.annotations.get_or_insert_default();
    a.remove(PROVISIONAL_UNTIL_ANNOTATION);
    a.insert(ROTATED_AT_ANNOTATION.into(), rfc3339(now));
    a.insert(EXPIRES_AT_ANNOTATION.into(), rfc3339(end));
}

/// Whether the account's existing token answers a POST asking for `expiration`: a request without
/// one takes the token as it is; one with a lifetime needs a token issued with that lifetime.
pub(crate) fn check_lifetime(
    secret: &Secret,
    expiration: Option<std::time::Duration>,
) -> Result<(), String> {
    let Some(want) = expiration else {
        return Ok(());
    };
    let have = annotation(&secret.metadata, EXPIRATION_SECONDS_ANNOTATION);
    if have == Some(want.as_secs().to_string().as_str()) {
        return Ok(());
    }
    let name = format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    Err(match expires_at(secret) {
        Some(end) => format!(
            "the account already has a token (secret {name}) that expires at {}, not one of expirationSeconds {}; rotate it (POST /v1/harvester/kubeconfig/rotate) for a token with this lifetime",
            rfc3339(end),
            want.as_secs()
        ),
        None => format!(
            "the account already has a token (secret {name}) that does not expire; rotate it (POST /v1/harvester/kubeconfig/rotate) for one of expirationSeconds {}",
            want.as_secs()
        ),
    })
}

/// The name of the account's current token Secret: the one the ServiceAccount names (a Secret
/// name; whether that Secret is the account's is [`check_secret`]'s to judge), else Harvester's
/// `<serviceAccount>-token`.
pub(crate) fn current_token_secret(sa: &ServiceAccount, names: &AccountNames) -> String {
    sa.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOKEN_SECRET_ANNOTATION))
        .filter(|n| {
            !n.is_empty()
                && n.len() <= 253
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        })
        .cloned()
        .unwrap_or_else(|| names.secret.clone())
}

/// Whether this service made the object (our managed-by label).
pub(crate) fn is_managed(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY)
}

fn managed_labels() -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([(
        MANAGED_BY_LABEL.to_string(),
        MANAGED_BY.to_string(),
    )]))
}

fn owner(names: &AccountNames, sa_uid: &str) -> Option<Vec<OwnerReference>> {
    Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ServiceAccount".into(),
        name: names.service_account.clone(),
        uid: sa_uid.into(),
        ..Default::default()
    }])
}

fn subject(names: &AccountNames) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: names.service_account.clone(),
        namespace: Some(names.namespace.clone()),
        ..Default::default()
    }
}

fn role_ref(role: &str) -> RoleRef {
    RoleRef {
        api_group: RBAC_GROUP.into(),
        kind: "ClusterRole".into(),
        name: role.into(),
    }
}

pub fn service_account(names: &AccountNames) -> ServiceAccount {
    ServiceAccount {
        metadata: ObjectMeta {
            name: Some(names.service_account.clone()),
            namespace: Some(names.namespace.clone()),
            labels: managed_labels(),
            ..Default::default()
        },
        ..Default::default()
    }
}

pub fn token_secret(names: &AccountNames, sa_uid: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(names.secret.clone()),
            namespace: Some(names.namespace.clone()),
            labels: managed_labels(),
            annotations: Some(BTreeMap::from([
                (
                    SA_NAME_ANNOTATION.to_string(),
                    names.service_account.clone(),
                ),
                (SA_UID_ANNOTATION.to_string(), sa_uid.to_string()),
            ])),
            owner_references: owner(names, sa_uid),
            ..Default::default()
        },
        type_: Some(SA_TOKEN_TYPE.into()),
        ..Default::default()
    }
}

pub fn role_binding(names: &AccountNames, sa_uid: &str) -> RoleBinding {
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(names.binding.clone()),
            namespace: Some(names.namespace.clone()),
            labels: managed_labels(),
            owner_references: owner(names, sa_uid),
            ..Default::default()
        },
        role_ref: role_ref(CLOUDPROVIDER_ROLE),
        subjects: Some(vec![subject(names)]),
    }
}

/// No ownerReference: a namespaced owner of a cluster-scoped object is never resolved by the garbage
/// collector. The label, the ServiceAccount's UID in an annotation and the subject identify it
/// instead.
pub fn cluster_role_binding(names: &AccountNames, sa_uid: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(names.binding.clone()),
            labels: managed_labels(),
            annotations: Some(BTreeMap::from([(
                BINDING_SA_UID_ANNOTATION.to_string(),
                sa_uid.to_string(),
            )])),
            ..Default::default()
        },
        role_ref: role_ref(CSI_DRIVER_ROLE),
        subjects: Some(vec![subject(names)]),
    }
}

/// Whether an existing token Secret can be used for the account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SecretCheck {
    /// The token Secret of this service account.
    Ours,
    /// A token Secret of an earlier service account of the same name (its uid differs): replaceable.
    Stale,
    /// Something else; the reason says what.
    Foreign(String),
}

/// Whether `secret` is a service-account token Secret of the ServiceAccount `service_account`
/// (of this one or of an earlier one of the name): what [`check_secret`] does not call Foreign.
pub(crate) fn is_token_of(secret: &Secret, service_account: &str) -> bool {
    secret.type_.as_deref() == Some(SA_TOKEN_TYPE)
        && annotation(&secret.metadata, SA_NAME_ANNOTATION) == Some(service_account)
}

pub(crate) fn check_secret(
    secret: &Secret,
    names: &AccountNames,
    sa_uid: Option<&str>,
) -> SecretCheck {
    let name = format!("{}/{}", names.namespace, names.secret);
    if secret.type_.as_deref() != Some(SA_TOKEN_TYPE) {
        return SecretCheck::Foreign(format!(
            "secret {name} exists with type {:?}, not {SA_TOKEN_TYPE}; delete it or choose another serviceAccountName",
            secret.type_.as_deref().unwrap_or("")
        ));
    }
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    let for_sa = annotations.get(SA_NAME_ANNOTATION).map(String::as_str);
    if for_sa != Some(names.service_account.as_str()) {
        return SecretCheck::Foreign(format!(
            "secret {name} is the token of serviceAccount {:?}, not {:?}; delete it or choose another serviceAccountName",
            for_sa.unwrap_or(""),
            names.service_account
        ));
    }
    match (annotations.get(SA_UID_ANNOTATION), sa_uid) {
        (Some(have), Some(want)) if have != want => SecretCheck::Stale,
        (Some(_), None) => SecretCheck::Stale,
        _ => SecretCheck::Ours,
    }
}

fn binds_only(subjects: &Option<Vec<Subject>>, names: &AccountNames) -> bool {
    matches!(subjects.as_deref(), Some([s])
        if s.kind == "ServiceAccount"
            && s.name == names.service_account
            && s.namespace.as_deref() == Some(names.namespace.as_str())
            && s.api_group.as_deref().unwrap_or("").is_empty())
}

fn describe(role_ref: &RoleRef, subjects: &Option<Vec<Subject>>) -> String {
    let subjects: Vec<String> = subjects
        .iter()
        .flatten()
        .map(|s| match &s.namespace {
            Some(ns) => format!("{} {ns}/{}", s.kind, s.name),
            None => format!("{} {}", s.kind, s.name),
        })
        .collect();
    format!(
        "it binds {} {} to [{}]",
        role_ref.kind,
        role_ref.name,
        subjects.join(", ")
    )
}

fn binding_matches(
    role_ref: &RoleRef,
    subjects: &Option<Vec<Subject>>,
    role: &str,
    names: &AccountNames,
) -> bool {
    role_ref.kind == "ClusterRole"
        && role_ref.name == role
        && role_ref.api_group == RBAC_GROUP
        && binds_only(subjects, names)
}

fn owner_text(names: &AccountNames, sa_uid: Option<&str>) -> String {
    match sa_uid {
        Some(uid) => format!("name:{} UID:{uid}", names.service_account),
        None => format!("name:{}", names.service_account),
    }
}

/// Upstream's wording for a binding that is not the account's, with what it binds instead.
pub(crate) fn check_role_binding(
    rb: &RoleBinding,
    names: &AccountNames,
    sa_uid: Option<&str>,
) -> Result<(), String> {
    if binding_matches(&rb.role_ref, &rb.subjects, CLOUDPROVIDER_ROLE, names) {
        return Ok(());
    }
    Err(format!(
        "rolebinding {}/{} is not owned by serviceAccount {}, try to delete and recreate ({})",
        names.namespace,
        names.binding,
        owner_text(names, sa_uid),
        describe(&rb.role_ref, &rb.subjects)
    ))
}

pub(crate) fn check_cluster_role_binding(
    crb: &ClusterRoleBinding,
    names: &AccountNames,
    sa_uid: Option<&str>,
) -> Result<(), String> {
    if binding_matches(&crb.role_ref, &crb.subjects, CSI_DRIVER_ROLE, names) {
        return Ok(());
    }
    Err(format!(
        "clusterrolebinding {} is not owned by serviceAccount {}, try to delete and recreate ({})",
        names.binding,
        owner_text(names, sa_uid),
        describe(&crb.role_ref, &crb.subjects)
    ))
}

/// Upstream's ownership rule for a binding GET serves (harvester
/// `pkg/api/kubeconfig/generate_handler.go` `validateOwner`): exactly one owner reference, the
/// ServiceAccount by name and UID. Our ClusterRoleBinding (cluster-scoped: no namespace) carries no
/// owner reference: our label and the UID annotation stand for it (one made before the annotation
/// existed, by the label alone). A namespaced binding has no such stand-in.
pub fn owned_by(meta: &ObjectMeta, names: &AccountNames, sa_uid: &str) -> bool {
    if let Some([o]) = meta.owner_references.as_deref() {
        return o.kind == "ServiceAccount" && o.name == names.service_account && o.uid == sa_uid;
    }
    if meta.namespace.is_some() {
        return false;
    }
    let ours = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY);
    let uid = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(BINDING_SA_UID_ANNOTATION));
    meta.owner_references
        .as_deref()
        .unwrap_or_default()
        .is_empty()
        && ours
        && uid.is_none_or(|u| u == sa_uid)
}

/// GET's verdict on the account's RoleBinding (see [`check_served_binding`]).
pub(crate) fn check_served_role_binding(
    rb: &RoleBinding,
    names: &AccountNames,
    sa_uid: &str,
) -> Result<(), String> {
    check_served_binding(
        &format!("rolebinding {}/{}", names.namespace, names.binding),
        &rb.metadata,
        &rb.role_ref,
        &rb.subjects,
        CLOUDPROVIDER_ROLE,
        names,
        sa_uid,
    )
}

/// GET's verdict on the account's ClusterRoleBinding (see [`check_served_binding`]).
pub(crate) fn check_served_cluster_role_binding(
    crb: &ClusterRoleBinding,
    names: &AccountNames,
    sa_uid: &str,
) -> Result<(), String> {
    check_served_binding(
        &format!("clusterrolebinding {}", names.binding),
        &crb.metadata,
        &crb.role_ref,
        &crb.subjects,
        CSI_DRIVER_ROLE,
        names,
        sa_uid,
    )
}

/// What GET says of a binding that is not the account's: upstream's words when it is not owned by
/// the ServiceAccount, ours when it is but binds something else.
fn check_served_binding(
    what: &str,
    meta: &ObjectMeta,
    role_ref: &RoleRef,
    subjects: &Option<Vec<Subject>>,
    role: &str,
    names: &AccountNames,
    sa_uid: &str,
) -> Result<(), String> {
    if !owned_by(meta, names, sa_uid) {
        return Err(format!(
            "{what} is not owned by serviceAccount {}, try to delete and recreate",
            owner_text(names, Some(sa_uid))
        ));
    }
    if !binding_matches(role_ref, subjects, role, names) {
        return Err(format!(
            "{what} does not bind ClusterRole {role} to serviceAccount {}/{} alone, try to delete and recreate ({})",
            names.namespace,
            names.service_account,
            describe(role_ref, subjects)
        ));
    }
    Ok(())
}

/// Reads `key` of a Secret's data as text.
pub(crate) fn secret_data(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|ByteString(b)| b.clone())
        .filter(|b| !b.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_names() -> AccountNames {
        AccountNames::new("a-b", "c")
    }

    #[test]
    fn built_objects_pass_their_own_checks() {
        let n = mk_names();
        let s = token_secret(&n, "uid-1");
        assert_eq!(check_secret(&s, &n, Some("uid-1")), SecretCheck::Ours);
        assert_eq!(check_secret(&s, &n, Some("uid-2")), SecretCheck::Stale);
        assert_eq!(check_secret(&s, &n, None), SecretCheck::Stale);
        assert!(check_role_binding(&role_binding(&n, "uid-1"), &n, Some("uid-1")).is_ok());
        assert!(check_cluster_role_binding(&cluster_role_binding(&n, "uid-1"), &n, None).is_ok());
        assert!(
            cluster_role_binding(&n, "uid-1")
                .metadata
                .owner_references
                .is_none()
        );
        assert!(owned_by(&role_binding(&n, "uid-1").metadata, &n, "uid-1"));
        assert!(owned_by(
            &cluster_role_binding(&n, "uid-1").metadata,
            &n,
            "uid-1"
        ));
        assert!(!owned_by(
            &cluster_role_binding(&n, "uid-1").metadata,
            &n,
            "uid-2"
        ));
        assert!(!owned_by(&role_binding(&n, "uid-1").metadata, &n, "uid-2"));
        // A RoleBinding without its owner reference is not ours, label or not.
        let mut rb = role_binding(&n, "uid-1");
        rb.metadata.owner_references = None;
        assert!(!owned_by(&rb.metadata, &n, "uid-1"));
        // A ClusterRoleBinding Harvester made carries the ServiceAccount as its owner.
        let mut crb = cluster_role_binding(&n, "uid-1");
        crb.metadata.labels = None;
        crb.metadata.annotations = None;
        crb.metadata.owner_references = role_binding(&n, "uid-1").metadata.owner_references;
        assert!(owned_by(&crb.metadata, &n, "uid-1"));
        assert!(!owned_by(&crb.metadata, &n, "uid-2"));
    }

    #[test]
    fn a_claim_is_set_read_and_removed_alone() {
        let n = mk_names();
        let until = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let mut sa = service_account(&n);
        assert_eq!(rotating_until(&sa), None);
        set_rotating(&mut sa, None);
        assert_eq!(sa.metadata.annotations, None);
        set_replaced(&mut sa, Some(("c-token-a", until)));
        set_rotating(&mut sa, Some(until));
        assert_eq!(rotating_until(&sa), Some(until));
        set_rotating(&mut sa, None);
        assert_eq!(rotating_until(&sa), None);
        assert_eq!(replaced_token(&sa), Some(("c-token-a", until)));
        // A claim that does not parse is none (it never blocks a rotation).
        sa.metadata
            .annotations
            .get_or_insert_default()
            .insert(ROTATING_UNTIL_ANNOTATION.into(), "soon".into());
        assert_eq!(rotating_until(&sa), None);
    }

    #[test]
    fn a_retired_token_keeps_its_grace_not_a_provisional_end() {
        let n = mk_names();
        let now = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let mut s = token_secret(&n, "u");
        set_provisional(&mut s, now + time::Duration::seconds(35));
        set_retiring(&mut s, now, now + time::Duration::hours(1));
        assert_eq!(provisional_until(&s), None);
        assert_eq!(expires_at(&s), Some(now + time::Duration::hours(1)));
        assert!(is_retired(&s));
    }

    #[test]
    fn colliding_account_is_foreign() {
        // ns=a-b, sa=c and ns=a, sa=b-c both name their ClusterRoleBinding a-b-c.
        let (mine, theirs) = (AccountNames::new("a", "b-c"), mk_names());
        assert_eq!(mine.binding, theirs.binding);
        let err = check_cluster_role_binding(&cluster_role_binding(&theirs, "t"), &mine, Some("u"))
            .unwrap_err();
        assert_eq!(
            err,
            "clusterrolebinding a-b-c is not owned by serviceAccount name:b-c UID:u, try to delete and recreate (it binds ClusterRole harvesterhci.io:csi-driver to [ServiceAccount a-b/c])"
        );
    }

    #[test]
    fn foreign_secrets_and_roles() {
        let n = mk_names();
        let mut s = token_secret(&n, "u");
        s.type_ = Some("Opaque".into());
        assert!(
            matches!(check_secret(&s, &n, Some("u")), SecretCheck::Foreign(m) if m.contains("Opaque"))
        );
        let mut rb = role_binding(&n, "u");
        rb.role_ref.name = "cluster-admin".into();
        assert!(
            check_role_binding(&rb, &n, Some("u"))
                .unwrap_err()
                .contains("cluster-admin")
        );
        let mut rb = role_binding(&n, "u");
        rb.subjects.as_mut().unwrap().push(Subject {
            kind: "User".into(),
            name: "eve".into(),
            ..Default::default()
        });
        assert!(
            check_role_binding(&rb, &n, Some("u"))
                .unwrap_err()
                .contains("User eve")
        );
    }
}
