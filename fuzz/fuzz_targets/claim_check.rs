//! Claim-check bodies (`AC 01 00` inline, `AC 01 01` + key): reading a body never panics, and a
//! key read from a message never names a file outside the store's root.
#![no_main]

use std::path::{Component, PathBuf};
use std::sync::OnceLock;

use acemq_amqp::patterns::claim_check::{claim_key_of, is_claim_check, ClaimCheckCodec, FilesystemClaimCheckStore};
use acemq_amqp::{BytesCodec, Codec};
use libfuzzer_sys::fuzz_target;

fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("acemq-fuzz-claims-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("fuzz root");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let store = FilesystemClaimCheckStore::new(root().clone()).expect("store");
    if let Some(key) = claim_key_of(data) {
        assert!(is_claim_check(data));
        if let Ok(path) = store.path_of(key) {
            let rel = path.strip_prefix(root()).expect("a key's file is under the root");
            assert!(
                rel.components().all(|c| matches!(c, Component::Normal(_))),
                "key {key:?} gives {path:?}"
            );
        }
    }
    let codec = ClaimCheckCodec::new(BytesCodec, store);
    let _ = codec.decode_bytes(data);
    let _ = codec.decode(data);
});
