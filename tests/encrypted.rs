//! The family's encrypted codec: the family's test vector and a body the Java library wrote
//! decrypt here, what this writes has the family's framing, failures are fatal and say nothing
//! secret, and on the real broker a foreign encrypted message is read (and a tampered one
//! dead-lettered).

#![cfg(feature = "encryption")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::codecs::encrypted::{
    frame, generate_key, key_from_base64, key_id_of, key_to_base64, EncryptedCodec, EncryptionKey,
    Keyring, ENCRYPTED_CONTENT_TYPE, NONCE_BYTES, TAG_BYTES,
};
use acemq_amqp::{
    dead_letter_queue, headers, BytesCodec, Codec, ConsumerOptions, FatalError, JsonCodec, Message,
    Outcome, QueueSpec,
};
use amiquip::AmqpProperties;
use serde_json::json;
use support::eventually;
use support::raw::Raw;

fn test_key() -> Vec<u8> {
    (0u8..32).collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Written by `org.acemq.amqp.crypto.EncryptedCodec` (Java) for key `2026-01` = `00..1f` and
/// plaintext `hello` (Python `tests/test_encrypted.py`, `JAVA_BODY`).
const JAVA_BODY: &str =
    "ae0107323032362d303175345ecc4a26ac55fcb992696364875909f4a91111aa73a811e509a7fedf911916";
/// The family's test vector: same key, nonce `00..0b`, plaintext `hello`.
const VECTOR: &str = concat!(
    "ae0107323032362d3031",
    "000102030405060708090a0b",
    "2f67ba77aa632797b83b1f88ef1394bb9ff6e85641"
);
/// The Go library's old magic-less framing: refused, not misread.
const GO_BODY: &str =
    "010007323032362d30311abb60483ecd9b10f2817d6bbc6716a5813db519e5fe797c96d6c725baf9ddbbe6";

fn codec() -> EncryptedCodec {
    EncryptedCodec::new(BytesCodec, Keyring::of("2026-01", test_key()).unwrap())
}

fn fatal_text(e: acemq_amqp::BoxError) -> String {
    assert!(
        e.downcast_ref::<FatalError>().is_some(),
        "not a FatalError: {e}"
    );
    e.to_string()
}

#[test]
fn the_familys_vector_and_a_java_body_decrypt_here() {
    let c = codec();
    assert_eq!(c.decrypt(&hex(VECTOR)).unwrap(), b"hello");
    assert_eq!(c.decrypt(&hex(JAVA_BODY)).unwrap(), b"hello");
    let m = Message::new(hex(JAVA_BODY)).with_content_type(ENCRYPTED_CONTENT_TYPE);
    assert_eq!(m.decode::<Vec<u8>>(&c).unwrap(), b"hello");
    assert_eq!(key_id_of(&hex(JAVA_BODY)), Some("2026-01"));
}

#[test]
fn what_this_writes_is_the_familys_framing() {
    let c = codec();
    let body = c.encode_bytes(b"hello".to_vec()).unwrap();
    let java = hex(JAVA_BODY);
    assert_eq!(body[..10], java[..10], "magic, version, length, key id");
    assert_eq!(body[..10], frame("2026-01")[..]);
    assert_eq!(body.len(), 3 + 7 + NONCE_BYTES + 5 + TAG_BYTES);
    assert_eq!(body.len(), java.len());
    assert_eq!(c.decrypt(&body).unwrap(), b"hello");
    // A fresh nonce each time.
    let nonces: std::collections::HashSet<Vec<u8>> = (0..64)
        .map(|_| c.encrypt(b"same").unwrap()[10..10 + NONCE_BYTES].to_vec())
        .collect();
    assert_eq!(nonces.len(), 64);
    // Through JSON, and the plaintext is nowhere in the body.
    let j = EncryptedCodec::new(JsonCodec, Keyring::of("2026-01", test_key()).unwrap());
    let m = Message::encode(&j, &json!({"card": "4111111111111111"})).unwrap();
    assert_eq!(m.content_type.as_deref(), Some(ENCRYPTED_CONTENT_TYPE));
    assert!(!m
        .body
        .windows(16)
        .any(|w| w == b"4111111111111111".as_slice()));
    assert_eq!(
        m.decode::<serde_json::Value>(&j).unwrap(),
        json!({"card": "4111111111111111"})
    );
    // AES-128 and AES-192 keys as Java accepts them.
    for len in [16, 24] {
        let k = EncryptedCodec::new(BytesCodec, Keyring::of("k", vec![7u8; len]).unwrap());
        assert_eq!(k.decrypt(&k.encrypt(b"x").unwrap()).unwrap(), b"x");
    }
}

#[test]
fn every_failure_is_fatal_and_a_wrong_key_looks_like_tampering() {
    let c = codec();
    let go = fatal_text(c.decrypt(&hex(GO_BODY)).unwrap_err());
    assert!(go.contains("not written by the encrypted codec"), "{go}");
    let written = c.encrypt(b"a message worth tampering with").unwrap();
    let short = fatal_text(c.decrypt(&written[..20]).unwrap_err());
    assert!(short.contains("too short"), "{short}");
    for position in [written.len() - 1, written.len() - 17, 12, 20] {
        let mut t = written.clone();
        t[position] ^= 1;
        fatal_text(c.decrypt(&t).unwrap_err());
    }
    let mut tampered = written.clone();
    *tampered.last_mut().unwrap() ^= 1;
    let from_tampering = fatal_text(c.decrypt(&tampered).unwrap_err());
    let other = EncryptedCodec::new(BytesCodec, Keyring::of("2026-01", vec![0u8; 32]).unwrap());
    let from_wrong_key = fatal_text(other.decrypt(&written).unwrap_err());
    assert_eq!(from_tampering, from_wrong_key);
    // The identifier is authenticated: relabelled to a key with the same bytes, it fails.
    let relabelled = [frame("2026-02"), written[10..].to_vec()].concat();
    let same_bytes = EncryptedCodec::new(BytesCodec, Keyring::of("2026-02", test_key()).unwrap());
    fatal_text(same_bytes.decrypt(&relabelled).unwrap_err());
    let unknown = fatal_text(
        EncryptedCodec::new(BytesCodec, Keyring::of("other", test_key()).unwrap())
            .decrypt(&written)
            .unwrap_err(),
    );
    assert!(
        unknown.contains("\"2026-01\"") && unknown.contains("other"),
        "{unknown}"
    );
    // Nothing secret in any of it.
    for text in [go, short, from_tampering, unknown] {
        assert!(!text.contains(&key_to_base64(&test_key())));
        assert!(!text.contains("tampering with"));
    }
}

#[test]
fn keys_print_their_names_only_and_are_checked() {
    let key = EncryptionKey::new("2026-01", test_key()).unwrap();
    assert_eq!(format!("{key:?}"), "EncryptionKey(id=\"2026-01\")");
    let ring = Keyring::new(key)
        .with_key(EncryptionKey::new("2026-02", generate_key()).unwrap())
        .use_key("2026-02")
        .unwrap();
    assert_eq!(ring.current().id(), "2026-02");
    assert_eq!(ring.ids(), ["2026-01", "2026-02"]);
    let shown = format!(
        "{ring:?} {:?}",
        EncryptedCodec::new(JsonCodec, ring.clone())
    );
    assert!(
        shown.contains("2026-01") && shown.contains("2026-02"),
        "{shown}"
    );
    assert!(!shown.contains(&key_to_base64(&test_key())));
    assert!(EncryptionKey::new("", test_key()).is_err());
    assert!(EncryptionKey::new("x".repeat(256), test_key()).is_err());
    assert!(EncryptionKey::new("a\0b", test_key()).is_err());
    assert!(EncryptionKey::new("k", vec![0u8; 31]).is_err());
    assert_eq!(
        key_from_base64(&format!(" {}\n", key_to_base64(&test_key()))).unwrap(),
        test_key()
    );
    let bad = key_from_base64("not base64!").unwrap_err().to_string();
    assert!(!bad.contains("not base64!"), "{bad}");
    assert!(key_from_base64(&key_to_base64(&[1u8; 10])).is_err());
    assert!(ring.clone().use_key("missing").is_err());
}

/// A foreign client publishes the Java body: the consumer reads `hello`; a tampered copy goes
/// to `.dlq` at once with the reason.
#[test]
fn on_the_broker_a_foreign_encrypted_message_is_read_and_a_tampered_one_dead_lettered() {
    let (conn, _clean, q) = support::declared_consumed_queue_with("encrypted", QueueSpec::classic);
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let c = Arc::new(codec());
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(move |m: &Message| {
            let plain: Vec<u8> = m.decode(c.as_ref())?;
            g.lock().unwrap().push(plain);
            Ok(Outcome::Accept)
        })
        .unwrap();
    let raw = Raw::open();
    let props = || AmqpProperties::default().with_content_type(ENCRYPTED_CONTENT_TYPE.into());
    raw.publish("", &q, &hex(JAVA_BODY), props());
    let mut tampered = hex(JAVA_BODY);
    tampered[20] ^= 1;
    raw.publish("", &q, &tampered, props());
    let dlq = dead_letter_queue(&q);
    assert!(eventually(Duration::from_secs(30), || {
        got.lock().unwrap().len() == 1 && conn.queue_info(&dlq).unwrap().message_count == 1
    }));
    consumer.close().unwrap();
    assert_eq!(got.lock().unwrap()[0], b"hello");
    let (props, _, body) = raw.get(&dlq).expect("the dead-letter copy");
    raw.close();
    assert_eq!(body, tampered, "the body goes to .dlq as it was");
    let error = match props.headers().as_ref().unwrap().get(headers::ERROR) {
        Some(amiquip::AmqpValue::LongString(s)) => s.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        error.contains("did not decrypt with key \"2026-01\""),
        "{error}"
    );
}
