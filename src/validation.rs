//! Kubernetes name rules (RFC 1123 labels and subdomains) with the API server's own wording, so a
//! rejected name reads the same here as from `kubectl`; and the random suffixes of generated names.

use rand::Rng;

pub const DNS1123_LABEL_MAX: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;

const LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Checks an RFC 1123 label (namespaces, most names); returns the API server's message on failure.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if s.len() > DNS1123_LABEL_MAX {
        return Err(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    if !is_label(s) {
        return Err(format!(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{LABEL_FMT}')"
        ));
    }
    Ok(())
}

/// Checks an RFC 1123 subdomain (service accounts, secrets, bindings).
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    if s.is_empty() || !s.split('.').all(is_label) {
        return Err(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{SUBDOMAIN_FMT}')"
        ));
    }
    Ok(())
}

/// Checks a name that only has to be a usable URL path segment (RBAC objects, e.g.
/// `harvesterhci.io:cloudprovider`).
pub fn path_segment_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("name or generateName is required".into());
    }
    if s == "." || s == ".." {
        return Err(format!("may not be '{s}'"));
    }
    for bad in ["/", "%"] {
        if s.contains(bad) {
            return Err(format!("may not contain '{bad}'"));
        }
    }
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    Ok(())
}

/// The alphabet of generated name suffixes (`generateName`, token names): `[a-z0-9]`.
pub const NAME_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// `n` random characters from `[a-z0-9]`, as Kubernetes appends them to a `generateName`.
pub fn random_alnum(n: usize) -> String {
    random_from(NAME_ALPHABET, n)
}

/// `n` random characters from `alphabet` (ASCII).
pub fn random_from(alphabet: &[u8], n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["a", "gc-test", "0", "a1-b2", &"x".repeat(63)] {
            assert!(dns1123_label(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"x".repeat(64), "ä"] {
            assert!(dns1123_label(bad).is_err(), "{bad}");
        }
        assert_eq!(
            dns1123_label(&"x".repeat(64)).unwrap_err(),
            "must be no more than 63 characters"
        );
    }

    #[test]
    fn path_segments() {
        assert!(path_segment_name("harvesterhci.io:cloudprovider").is_ok());
        for bad in ["", ".", "..", "a/b", "a%b"] {
            assert!(path_segment_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subdomains() {
        for ok in [
            "a",
            "a.b",
            "harvester-cloud-provider",
            "a-1.b-2.c",
            &"x".repeat(253),
        ] {
            assert!(dns1123_subdomain(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "A.b",
            "a_b",
            "a b",
            &"x".repeat(254),
        ] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
    }
}
