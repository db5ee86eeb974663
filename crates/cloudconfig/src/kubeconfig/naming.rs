//! Object names of a cloud-config account: wrangler's `SafeConcatName`, as Harvester v1.9 uses, so
//! GET finds objects that Harvester itself created.

use sha2::{Digest, Sha256};

/// Joins `parts` with `-`; a result of 64 bytes or more is cut to 63 with a hash suffix
/// (wrangler `name.SafeConcatName`).
pub(crate) fn safe_concat_name(parts: &[&str]) -> String {
    let joined = parts.join("-");
    if joined.len() < 64 {
        return joined;
    }
    let hash = hex::encode(Sha256::digest(joined.as_bytes()));
    let b = joined.as_bytes();
    // Cut at 57 when the byte at 56 can end a name, so the result never has `--` or ends badly.
    let (keep, hash_len) = if b[56].is_ascii_lowercase() || b[56].is_ascii_digit() {
        (57, 5)
    } else {
        (56, 6)
    };
    // Names are ASCII (validated), but never slice inside a UTF-8 sequence even if they are not.
    let prefix = String::from_utf8_lossy(&b[..keep]);
    format!("{prefix}-{}", &hash[..hash_len])
}

/// The names of the objects that make up one account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountNames {
    pub namespace: String,
    pub service_account: String,
    pub secret: String,
    /// Name of both the RoleBinding (in `namespace`) and the ClusterRoleBinding.
    pub binding: String,
}

impl AccountNames {
    pub fn new(namespace: &str, service_account: &str) -> Self {
        AccountNames {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
            secret: safe_concat_name(&[service_account, "token"]),
            binding: safe_concat_name(&[namespace, service_account]),
        }
    }

    /// The same account with its token in the Secret `secret` (after a rotation).
    pub fn with_secret(&self, secret: String) -> Self {
        AccountNames {
            secret,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers_from_the_reference() {
        let n = |c: char, k: usize| c.to_string().repeat(k);
        let cases: Vec<(Vec<String>, &str)> = vec![
            (vec!["gc-test".into(), "gc4".into()], "gc-test-gc4"),
            (
                vec!["harvester-cloud-provider".into(), "token".into()],
                "harvester-cloud-provider-token",
            ),
            (
                vec![n('n', 31), n('s', 32)],
                "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn-sssssssssssssssssssssssss-821b5",
            ),
            (
                vec![n('a', 60), "token".into()],
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-abff0",
            ),
            (
                vec![format!("{}-abcdef", n('x', 56)), "token".into()],
                "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-c479b6",
            ),
            (
                vec![
                    "guest-cluster-namespace-with-a-rather-long-name".into(),
                    "guest-cluster-service-account-name".into(),
                ],
                "guest-cluster-namespace-with-a-rather-long-name-guest-clu-03d34",
            ),
        ];
        for (parts, want) in cases {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let got = safe_concat_name(&parts);
            assert_eq!(got, want, "{parts:?}");
            assert!(got.len() <= 63);
        }
        // 63 characters joined: unchanged.
        let p = [n('n', 31), n('s', 31)];
        assert_eq!(
            safe_concat_name(&[&p[0], &p[1]]),
            format!("{}-{}", p[0], p[1])
        );
    }

    #[test]
    fn account_names() {
        let a = AccountNames::new("gc-test", "gc4");
        assert_eq!(a.secret, "gc4-token");
        assert_eq!(a.binding, "gc-test-gc4");
    }
}
