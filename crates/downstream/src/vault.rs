//! The sealing of URL-mode grants at rest (docs/DOWNSTREAM.md, "Keys"): AES-256-GCM with a random 96-bit nonce per
//! write and the (user, downstream) pair as associated data, so that a sealed grant opens only for the user and the
//! downstream it was sealed for (moved to another user's key in Redis, it does not open). Keys form a ring in the
//! `--request-state-key` format, `KID:BASE64` (32 bytes): the first seals, every one opens, so a key is rotated by
//! putting the new one first, and dropped once every grant sealed with it has been refreshed or has expired.
//!
//! A sealed grant is `g1` ‖ the key id's length (one byte) ‖ the key id ‖ the nonce ‖ the ciphertext and its tag.

use crate::OAuthError;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

const MAGIC: &[u8; 2] = b"g1";

/// The key ring.
pub struct Vault {
    keys: Vec<(String, Aes256Gcm)>,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault").field("keys", &self.keys.iter().map(|(k, _)| k).collect::<Vec<_>>()).finish()
    }
}

fn aad(user: &str, downstream: &str) -> Vec<u8> {
    [b"mcpfleet/grant/v1\0", user.as_bytes(), b"\0", downstream.as_bytes()].concat()
}

impl Vault {
    /// A ring of `(key id, 32-byte key)`, the first sealing.
    ///
    /// # Errors
    /// [`OAuthError::Schema`] (pointer `--downstream-key`): no key, a key that is not 32 bytes, a key id that is not
    /// `[A-Za-z0-9_.-]{1,32}`, or one given twice.
    pub fn new(keys: Vec<(String, Vec<u8>)>) -> Result<Self, OAuthError> {
        let bad = |expected: String| OAuthError::Schema { pointer: "--downstream-key".to_owned(), expected };
        if keys.is_empty() {
            return Err(bad("at least one key".to_owned()));
        }
        let mut ring: Vec<(String, Aes256Gcm)> = Vec::new();
        for (kid, key) in keys {
            if kid.is_empty()
                || kid.len() > 32
                || !kid.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            {
                return Err(bad(format!("a key id of 1-32 letters, digits, '_', '.' or '-', not {kid:?}")));
            }
            if ring.iter().any(|(k, _)| *k == kid) {
                return Err(bad(format!("each key id once; {kid:?} is given twice")));
            }
            let cipher = Aes256Gcm::new_from_slice(&key)
                .map_err(|_| bad(format!("key {kid:?}: 32 bytes (base64 of 32 random bytes), not {}", key.len())))?;
            ring.push((kid, cipher));
        }
        Ok(Self { keys: ring })
    }

    /// `plaintext` sealed for `user` and `downstream` with the first key.
    ///
    /// # Errors
    /// [`OAuthError::Client`] if the cipher refuses (it does not for inputs under 64 GiB).
    pub fn seal(&self, user: &str, downstream: &str, plaintext: &[u8]) -> Result<Vec<u8>, OAuthError> {
        let (kid, cipher) = &self.keys[0];
        let nonce: [u8; 12] = rand::random();
        let aad = aad(user, downstream);
        let sealed = cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: &aad })
            .map_err(|_| OAuthError::Client("sealing failed".to_owned()))?;
        let kid_len = u8::try_from(kid.len()).unwrap_or(u8::MAX);
        Ok([&MAGIC[..], &[kid_len], kid.as_bytes(), &nonce, &sealed].concat())
    }

    /// Opens a grant sealed for `user` and `downstream` with any key of the ring.
    ///
    /// # Errors
    /// [`OAuthError::Response`]: not a sealed grant, sealed with a key no longer in the ring, altered, or sealed
    /// for another user or downstream (the message says which, never the content).
    pub fn open(&self, user: &str, downstream: &str, sealed: &[u8]) -> Result<Vec<u8>, OAuthError> {
        let bad = |why: &str| OAuthError::Response(format!("the stored grant {why}"));
        let rest = sealed.strip_prefix(MAGIC).ok_or_else(|| bad("is not one this build seals"))?;
        let (&kid_len, rest) = rest.split_first().ok_or_else(|| bad("is cut short"))?;
        let kid_len = usize::from(kid_len);
        if rest.len() < kid_len + 12 + 16 {
            return Err(bad("is cut short"));
        }
        let (kid, rest) = rest.split_at(kid_len);
        let (nonce, ciphertext) = rest.split_at(12);
        let (_, cipher) = self
            .keys
            .iter()
            .find(|(k, _)| k.as_bytes() == kid)
            .ok_or_else(|| bad("was sealed with a key no longer in --downstream-key"))?;
        let aad = aad(user, downstream);
        cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ciphertext, aad: &aad })
            .map_err(|_| bad("does not open: altered, or sealed for another user or downstream"))
    }

    /// The id of the key that seals.
    #[must_use]
    pub fn sealing_key(&self) -> &str {
        &self.keys[0].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(kids: &[(&str, u8)]) -> Vault {
        Vault::new(kids.iter().map(|(k, b)| ((*k).to_owned(), vec![*b; 32])).collect()).unwrap()
    }

    #[test]
    fn a_grant_opens_only_for_its_user_and_downstream() {
        let v = ring(&[("k1", 1)]);
        let sealed = v.seal("alice", "tickets", b"{\"access_token\":\"secret-token\"}").unwrap();
        assert!(!sealed.windows(12).any(|w| w == b"secret-token"), "ciphertext");
        assert_eq!(v.open("alice", "tickets", &sealed).unwrap(), b"{\"access_token\":\"secret-token\"}");
        assert_ne!(
            v.seal("alice", "tickets", b"x").unwrap(),
            v.seal("alice", "tickets", b"x").unwrap(),
            "a nonce each"
        );
        for (user, downstream) in [("bob", "tickets"), ("alice", "calendar"), ("alicetickets", "")] {
            let e = v.open(user, downstream, &sealed).unwrap_err().to_string();
            assert!(e.contains("sealed for another user or downstream"), "{e}");
        }
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert!(v.open("alice", "tickets", &altered).is_err());
        assert!(v.open("alice", "tickets", b"g1").is_err());
        assert!(v.open("alice", "tickets", b"plain").is_err());
    }

    #[test]
    fn rotation_seals_with_the_first_key_and_opens_with_any() {
        let old = ring(&[("k1", 1)]);
        let sealed_old = old.seal("alice", "tickets", b"t1").unwrap();
        let rotated = ring(&[("k2", 2), ("k1", 1)]);
        assert_eq!(rotated.sealing_key(), "k2");
        assert_eq!(rotated.open("alice", "tickets", &sealed_old).unwrap(), b"t1", "the old key still opens");
        let sealed_new = rotated.seal("alice", "tickets", b"t2").unwrap();
        let e = old.open("alice", "tickets", &sealed_new).unwrap_err().to_string();
        assert!(e.contains("no longer in --downstream-key"), "{e}");
        let dropped = ring(&[("k2", 2)]);
        assert!(dropped.open("alice", "tickets", &sealed_old).is_err(), "dropped: the old grants ask again");
        assert!(Vault::new(vec![("k".into(), vec![0; 16])]).unwrap_err().to_string().contains("32 bytes"));
        assert!(Vault::new(vec![("k".into(), vec![0; 32]), ("k".into(), vec![1; 32])]).is_err());
        assert!(Vault::new(vec![("bad kid".into(), vec![0; 32])]).is_err());
        assert!(Vault::new(Vec::new()).is_err());
    }
}
