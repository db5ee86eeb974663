//! Admin API tokens in Rancher's format, `token-<5 lowercase alphanumerics>:<secret>`, and the
//! credentials a request can carry them in (Bearer, or Basic with the name as user).

use std::fmt;

use base64::{Engine, engine::general_purpose::STANDARD as B64};

use crate::validation::{NAME_ALPHABET, random_alnum, random_from};

/// Rancher's token alphabet: lowercase consonants and digits that cannot be misread.
const SECRET_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const SECRET_LEN: usize = 54;
/// A token as presented by a client. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    pub name: String,
    pub secret: String,
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiToken")
            .field("name", &self.name)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl ApiToken {
    /// A fresh token with a random name and a 54-character secret (about 256 bits).
    pub fn generate() -> Self {
        ApiToken {
            name: format!("token-{}", random_alnum(5)),
            secret: random_from(SECRET_ALPHABET, SECRET_LEN),
        }
    }

    /// Parses `name:secret`; `None` unless both parts are present.
    pub fn parse(s: &str) -> Option<Self> {
        let (name, secret) = s.split_once(':')?;
        if name.is_empty() || secret.is_empty() {
            return None;
        }
        Some(ApiToken {
            name: name.to_string(),
            secret: secret.to_string(),
        })
    }

    /// The text a client sends, `name:secret`.
    pub fn expose(&self) -> String {
        format!("{}:{}", self.name, self.secret)
    }

    /// Whether the name has Rancher's shape, `token-` and five lowercase alphanumerics.
    pub(crate) fn has_rancher_name(&self) -> bool {
        self.name
            .strip_prefix("token-")
            .is_some_and(|s| s.len() == 5 && s.bytes().all(|c| NAME_ALPHABET.contains(&c)))
    }
}

/// What a request presents to prove who it is. `Debug` never shows a secret.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// An API token `name:secret` (Rancher's format).
    Api(ApiToken),
    /// Any other bearer token (a Kubernetes service-account or OIDC token).
    Bearer(String),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Api(t) => t.fmt(f),
            Credential::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

impl Credential {
    /// The secret text as the client sent it, to hash for cache keys.
    pub(crate) fn secret_text(&self) -> String {
        match self {
            Credential::Api(t) => t.expose(),
            Credential::Bearer(b) => b.clone(),
        }
    }
}

/// Reads the credentials of an `Authorization` header value.
///
/// `Bearer name:secret` is what Rancher's clients send; `Basic base64(name:secret)` is what Terraform
/// and some scripts send; any other bearer token is passed on as such. Anything else is `None`.
pub fn from_authorization(header: &str) -> Option<Credential> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    let rest = rest.trim();
    if rest.is_empty() {
        return None;
    }
    if scheme.eq_ignore_ascii_case("bearer") {
        Some(match ApiToken::parse(rest) {
            Some(t) => Credential::Api(t),
            None => Credential::Bearer(rest.to_string()),
        })
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = B64.decode(rest).ok()?;
        ApiToken::parse(std::str::from_utf8(&decoded).ok()?).map(Credential::Api)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_have_rancher_shape() {
        let t = ApiToken::generate();
        assert!(t.has_rancher_name(), "{}", t.name);
        assert_eq!(t.secret.len(), 54);
        assert!(t.secret.bytes().all(|c| SECRET_ALPHABET.contains(&c)));
        assert_eq!(ApiToken::parse(&t.expose()), Some(t.clone()));
        assert!(!format!("{t:?}").contains(&t.secret));
    }

    #[test]
    fn authorization_headers() {
        let want = Credential::Api(ApiToken::parse("token-abcde:s3cret").unwrap());
        assert_eq!(
            from_authorization("Bearer token-abcde:s3cret"),
            Some(want.clone())
        );
        assert_eq!(
            from_authorization("bearer  token-abcde:s3cret "),
            Some(want.clone())
        );
        let basic = format!("Basic {}", B64.encode("token-abcde:s3cret"));
        assert_eq!(from_authorization(&basic), Some(want));
        // Anything else after Bearer is some other kind of token, never shown by Debug.
        for other in ["Bearer eyJhbGciOi.x.y", "Bearer token-abcde", "Bearer :x"] {
            let c = from_authorization(other).unwrap();
            assert!(matches!(c, Credential::Bearer(_)), "{other}");
            assert!(!format!("{c:?}").contains(other.trim_start_matches("Bearer ")));
        }
        for bad in [
            "",
            "Bearer",
            "Bearer  ",
            "Digest a:b",
            "Basic !!!",
            "Basic eA==",
        ] {
            assert_eq!(from_authorization(bad), None, "{bad}");
        }
    }
}
