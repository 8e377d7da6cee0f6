//! The keys this replica has authenticated, held in memory so that a request does not read
//! its caller's key from the database.
//!
//! **A revoked key is never served from here.** The replica that revokes a key forgets it
//! as the revocation commits. On PostgreSQL a trigger announces every revoked or removed
//! key on channel [`CHANNEL`] (migration `0021`; delivered at commit, and only if it
//! commits), however it was revoked, and every replica listens there and forgets it: another replica refuses the key as soon as the
//! announcement arrives, milliseconds after the commit. A replica that is not listening
//! (starting, or its listening connection lost, when announcements may have been missed)
//! keeps no key and reads every one from the database; once it listens again it starts
//! empty. On SQLite one process serves the database, so its own forgetting is enough.
//!
//! A read that began before a revocation must not put the revoked key back: every forget
//! moves the generation on, and a key read in an earlier generation is not kept.
//!
//! Only keys that authenticated are kept (an unknown secret is read every time), at most
//! [`MAX_KEYS`]; past that the cache starts again empty.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::iam::Principal;
use crate::store::{Backend, Store};

/// The channel a revocation is announced on, with the key's id.
const CHANNEL: &str = "orl_keys";
/// The most keys held at once.
pub const MAX_KEYS: usize = 10_000;

/// Authenticated keys by the digest of their secret.
pub struct KeyCache {
    inner: Mutex<Inner>,
}

struct Inner {
    keys: HashMap<String, Principal>,
    generation: u64,
    /// Whether keys may be kept now: always on SQLite, while listening on PostgreSQL.
    keeping: bool,
}

/// What the cache knows of a digest.
pub enum Lookup {
    Known(Principal),
    /// Not held: read it, and keep it with this generation.
    Unknown(u64),
}

impl KeyCache {
    /// An empty cache for `store`'s database; on PostgreSQL it starts listening for
    /// revocations at once, and keeps keys only while it listens.
    pub fn new(store: &Store) -> Arc<KeyCache> {
        let postgres = store.backend() == Backend::Postgres;
        let cache = Arc::new(KeyCache {
            inner: Mutex::new(Inner {
                keys: HashMap::new(),
                generation: 0,
                keeping: !postgres,
            }),
        });
        if postgres {
            let url = store.pool().connect_options().database_url.to_string();
            tokio::spawn(listen(url, Arc::downgrade(&cache)));
        }
        cache
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("key cache")
    }

    /// The caller the secret with `digest` stands for, if held.
    pub fn get(&self, digest: &str) -> Lookup {
        let inner = self.inner();
        match inner.keys.get(digest) {
            Some(principal) => Lookup::Known(principal.clone()),
            None => Lookup::Unknown(inner.generation),
        }
    }

    /// Keeps what the database answered for `digest`, unless a key was forgotten since the
    /// read began (at `generation`) or keys are not kept now.
    pub fn keep(&self, digest: String, principal: Principal, generation: u64) {
        let mut inner = self.inner();
        if !inner.keeping || inner.generation != generation {
            return;
        }
        if inner.keys.len() >= MAX_KEYS {
            inner.keys.clear();
        }
        inner.keys.insert(digest, principal);
    }

    /// Forgets the key with id `key_id` (revoked).
    pub fn forget(&self, key_id: &str) {
        let mut inner = self.inner();
        inner.generation += 1;
        inner.keys.retain(|_, principal| principal.key_id != key_id);
    }

    /// Forgets every key, and keeps keys from now on or not.
    fn reset(&self, keeping: bool) {
        let mut inner = self.inner();
        inner.generation += 1;
        inner.keys.clear();
        inner.keeping = keeping;
    }
}

/// Listens on [`CHANNEL`] while `cache` lives, reconnecting after a failure; keys are kept
/// only while a listening connection is up.
async fn listen(url: String, cache: std::sync::Weak<KeyCache>) {
    loop {
        match sqlx::postgres::PgListener::connect(&url).await {
            Ok(mut listener) => match listener.listen(CHANNEL).await {
                Ok(()) => {
                    let Some(held) = cache.upgrade() else { return };
                    held.reset(true);
                    drop(held);
                    loop {
                        let note = listener.try_recv().await;
                        let Some(held) = cache.upgrade() else { return };
                        match note {
                            Ok(Some(note)) => held.forget(note.payload()),
                            // The connection dropped: announcements may have been missed.
                            Ok(None) => break,
                            Err(err) => {
                                tracing::warn!(error = %err, "key cache: listener failed; reconnecting");
                                break;
                            }
                        }
                    }
                }
                Err(err) => tracing::warn!(error = %err, "key cache: cannot LISTEN; retrying"),
            },
            Err(err) => tracing::warn!(error = %err, "key cache: cannot connect to listen"),
        }
        match cache.upgrade() {
            Some(held) => held.reset(false),
            None => return,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> KeyCache {
        KeyCache {
            inner: Mutex::new(Inner {
                keys: HashMap::new(),
                generation: 0,
                keeping: true,
            }),
        }
    }

    fn principal(key_id: &str) -> Principal {
        Principal {
            key_id: key_id.into(),
            org_id: "acme".into(),
            permissions: Default::default(),
            agent: false,
        }
    }

    fn generation(cache: &KeyCache, digest: &str) -> u64 {
        match cache.get(digest) {
            Lookup::Known(p) => panic!("{} is held", p.key_id),
            Lookup::Unknown(generation) => generation,
        }
    }

    #[test]
    fn a_kept_key_is_served_until_it_is_forgotten() {
        let cache = cache();
        let at = generation(&cache, "d1");
        cache.keep("d1".into(), principal("key_1"), at);
        assert!(matches!(cache.get("d1"), Lookup::Known(p) if p.key_id == "key_1"));
        cache.forget("key_2");
        assert!(matches!(cache.get("d1"), Lookup::Known(_)));
        cache.forget("key_1");
        generation(&cache, "d1");
    }

    #[test]
    fn a_read_that_began_before_a_revocation_is_not_kept() {
        let cache = cache();
        let at = generation(&cache, "d1");
        cache.forget("key_1");
        cache.keep("d1".into(), principal("key_1"), at);
        generation(&cache, "d1");
    }

    #[test]
    fn nothing_is_kept_while_not_listening() {
        let cache = cache();
        let at = generation(&cache, "d1");
        cache.keep("d1".into(), principal("key_1"), at);
        cache.reset(false);
        let at = generation(&cache, "d1");
        cache.keep("d1".into(), principal("key_1"), at);
        generation(&cache, "d1");
        cache.reset(true);
        let at = generation(&cache, "d1");
        cache.keep("d1".into(), principal("key_1"), at);
        assert!(matches!(cache.get("d1"), Lookup::Known(_)));
    }

    #[test]
    fn past_the_limit_the_cache_starts_again() {
        let cache = cache();
        for i in 0..=MAX_KEYS {
            cache.keep(format!("d{i}"), principal(&format!("key_{i}")), 0);
        }
        assert_eq!(cache.inner().keys.len(), 1);
        assert!(matches!(
            cache.get(&format!("d{MAX_KEYS}")),
            Lookup::Known(_)
        ));
    }
}
