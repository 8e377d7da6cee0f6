//! The one id scheme: `<prefix>_<ulid>` in lowercase Crockford base32 (the alphabet the
//! API's id patterns accept), time-ordered by the injected clock. API key secrets are
//! `or_` plus 43 random base62 characters and are only ever stored as a SHA-256 digest.

use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::{Digest, Sha256};
use ulid::Ulid;

/// A new id such as `pool_01jd…` whose time part is `now_ms`.
pub fn new_id(prefix: &str, now_ms: i64) -> String {
    let ulid = Ulid::from_parts(now_ms.max(0) as u64, rand::rng().random());
    format!("{prefix}_{}", ulid.to_string().to_ascii_lowercase())
}

/// A fresh API key secret (`or_…`), 256 bits of randomness.
pub fn new_secret() -> String {
    let body: String = rand::rng()
        .sample_iter(Alphanumeric)
        .take(43)
        .map(char::from)
        .collect();
    format!("or_{body}")
}

/// The digest under which a secret is stored and looked up. Secrets carry 256 bits of
/// entropy, so a fast hash is enough: there is nothing to brute-force.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_use_lowercase_crockford_base32() {
        let id = new_id("pool", 1_764_417_000_000);
        let re = regex::Regex::new("^pool_[0-9a-hjkmnp-tv-z]{26}$").unwrap();
        assert!(re.is_match(&id), "{id}");
    }

    #[test]
    fn ids_sort_by_the_clock() {
        assert!(new_id("rsv", 1_000) < new_id("rsv", 2_000));
    }

    #[test]
    fn secrets_are_distinct_and_hash_stably() {
        let (a, b) = (new_secret(), new_secret());
        assert!(a.starts_with("or_") && a.len() == 46);
        assert_ne!(a, b);
        assert_eq!(hash_secret(&a), hash_secret(&a));
        assert_ne!(hash_secret(&a), hash_secret(&b));
    }
}
