//! Time and identifiers.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// 64 random bits (from the standard library's randomly keyed hasher and a counter).
pub(crate) fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_i64(now_ms());
    h.finish()
}

/// A fresh random identifier in the UUID version 4 text form.
pub fn new_id() -> String {
    let hi = (random_u64() & 0xffff_ffff_ffff_0fff) | 0x4000;
    let lo = (random_u64() & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// A SHA-256 digest's first 16 bytes in the UUID version 8 text form (version and variant bits
/// set): how the crate derives an id that must be the same every time it is computed for the
/// same input (a pipeline step's next message, a routing slip's hop, a foreign message's id).
pub(crate) fn uuid_v8(digest: &[u8]) -> String {
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let n = u128::from_be_bytes(b);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        n >> 96,
        (n >> 80) & 0xffff,
        (n >> 64) & 0xffff,
        (n >> 48) & 0xffff,
        n & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_v8_is_the_digest_with_version_and_variant_bits() {
        use sha2::{Digest, Sha256};
        // The value the three former copies of this code computed (checked independently).
        assert_eq!(
            super::uuid_v8(&Sha256::digest(b"acemq")),
            "604017b7-5166-84e1-bf0f-ca71d9816912"
        );
    }
}
