//! The LoadBalancer name of a guest Service, exactly as the upstream cloud provider computes it (so
//! existing LoadBalancers keep being found): `<cluster>-<ns>-<svc>-` cut to 55 characters, followed
//! by the CRC-32 of the untruncated prefix and the Service UID.

const MAX_BASE: usize = 55;

/// RFC 1035 label: starts with a letter, then letters, digits or '-', ends alphanumeric, ≤ 63.
pub fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

/// The LoadBalancer name for `service` in `namespace` of guest cluster `cluster`, with `uid`.
pub fn load_balancer_name(cluster: &str, namespace: &str, service: &str, uid: &str) -> String {
    let cluster = if is_dns1035_label(cluster) {
        cluster.to_string()
    } else {
        format!("a{cluster}")
    };
    let base = format!("{cluster}-{namespace}-{service}-");
    let suffix = format!("{:08x}", crc32fast::hash(format!("{base}{uid}").as_bytes()));
    // Names are ASCII (Kubernetes names), so a byte cut is a character cut.
    let cut = base.len().min(MAX_BASE);
    let base = base.get(..cut).unwrap_or(&base);
    format!("{base}{suffix}")
}

/// The name of the LoadBalancer that holds the address of a sharing group: the Services of
/// `namespace` in guest cluster `cluster` with sharing key `key`. Made the way upstream makes a
/// Service's (`<cluster>-<namespace>-shared-<key>-` cut to 55 characters, then 8 hex digits of a
/// CRC-32), with the key reduced to lowercase letters, digits and `-` for the readable part; the
/// CRC-32 is of the cluster, namespace and key as given, so keys that read alike stay apart.
pub fn shared_load_balancer_name(cluster: &str, namespace: &str, key: &str) -> String {
    let cluster = if is_dns1035_label(cluster) {
        cluster.to_string()
    } else {
        format!("a{cluster}")
    };
    let mut slug = String::with_capacity(key.len());
    for c in key.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_end_matches('-');
    let base = if slug.is_empty() {
        format!("{cluster}-{namespace}-shared-")
    } else {
        format!("{cluster}-{namespace}-shared-{slug}-")
    };
    let suffix = format!(
        "{:08x}",
        crc32fast::hash(format!("{cluster}/{namespace}/sharing-key/{key}").as_bytes())
    );
    let cut = base.len().min(MAX_BASE);
    let base = base.get(..cut).unwrap_or(&base);
    format!("{base}{suffix}")
}

/// The LoadBalancer namespace: the cloud-config's current-context namespace, else `default`.
pub fn load_balancer_namespace(context_namespace: Option<&str>) -> String {
    context_namespace
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
        .to_string()
}

/// Whether upstream warns about this cluster name (`--cluster-name` empty or `kubernetes`).
pub fn cluster_name_is_default(name: &str) -> bool {
    name.is_empty() || name == "kubernetes"
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "d4b50d98-39ec-4d88-8098-36579de5db4a";

    #[test]
    fn known_answers_from_the_reference() {
        assert_eq!(
            load_balancer_name("test", "default", "abcd", UID),
            "test-default-abcd-7198d990"
        );
        assert_eq!(
            load_balancer_name("1test", "default", "abcd", UID),
            "a1test-default-abcd-725d6700"
        );
        assert_eq!(
            load_balancer_name(
                "test",
                "default-default",
                "kube-system-rke2-ingress-nginx-controller",
                UID
            ),
            "test-default-default-kube-system-rke2-ingress-nginx-con5cd57013"
        );
    }

    #[test]
    fn shared_names_fit_and_depend_on_the_key_as_given() {
        let name = shared_load_balancer_name("gc1", "default", "dns");
        assert!(name.starts_with("gc1-default-shared-dns-"), "{name}");
        assert_eq!(name.len(), "gc1-default-shared-dns-".len() + 8);
        // Keys that read alike in a name are still apart.
        let upper = shared_load_balancer_name("gc1", "default", "DNS");
        assert!(upper.starts_with("gc1-default-shared-dns-"));
        assert_ne!(upper, name);
        assert_ne!(
            shared_load_balancer_name("gc1", "other", "dns"),
            shared_load_balancer_name("gc2", "other", "dns")
        );
        // Anything a MetalLB key may hold still makes a name: letters, digits and dashes, at
        // most 63 characters, starting with a letter.
        for key in ["a b/c:d", "!!!", "x".repeat(300).as_str(), "ü-key"] {
            let n = shared_load_balancer_name("1test", "default", key);
            assert!(n.len() <= 63, "{n}");
            assert!(is_dns1035_label(&n), "{n}");
        }
        assert!(
            shared_load_balancer_name("gc1", "default", "!!!").starts_with("gc1-default-shared-")
        );
        assert_eq!(
            shared_load_balancer_name("gc1", "default", "a b/c:d")
                .rsplit_once('-')
                .map(|(base, _)| base),
            Some("gc1-default-shared-a-b-c-d")
        );
    }

    #[test]
    fn names_fit_and_depend_on_the_uid() {
        let long = "s".repeat(200);
        let n = load_balancer_name("c", "ns", &long, UID);
        assert_eq!(n.len(), 63);
        assert_ne!(n, load_balancer_name("c", "ns", &long, "other-uid"));
        assert!(is_dns1035_label("a-1"));
        assert!(
            !is_dns1035_label("1a")
                && !is_dns1035_label("A")
                && !is_dns1035_label("a-")
                && !is_dns1035_label("")
        );
        assert_eq!(load_balancer_namespace(None), "default");
        assert_eq!(load_balancer_namespace(Some("")), "default");
        assert_eq!(load_balancer_namespace(Some("gc-test")), "gc-test");
    }
}
