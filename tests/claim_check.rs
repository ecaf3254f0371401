//! Claim checks: every case of the family's vector (`fixtures/claim_check.json`), the
//! threshold, the filesystem store's refused keys and atomic writes, a missing claim
//! dead-lettered, and a 1 MiB payload through the real broker.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::claim_check::{
    claim_key_of, is_claim_check, ClaimCheckCodec, ClaimCheckStore, FilesystemClaimCheckStore,
};
use acemq_amqp::{BytesCodec, Codec, ConsumerOptions, Error, JsonCodec, Message, Outcome};
use serde_json::Value;
use support::eventually;

const WAIT: Duration = Duration::from_secs(30);

fn vector() -> Value {
    serde_json::from_str(include_str!("fixtures/claim_check.json")).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A store in memory that records what it was asked.
#[derive(Debug, Default, Clone)]
struct MemoryStore {
    held: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    deleted: Arc<Mutex<usize>>,
}

impl ClaimCheckStore for MemoryStore {
    fn put(&self, payload: &[u8]) -> acemq_amqp::Result<String> {
        let key = format!("k/{}", acemq_amqp::new_id());
        self.held
            .lock()
            .unwrap()
            .insert(key.clone(), payload.to_vec());
        Ok(key)
    }
    fn get(&self, key: &str) -> acemq_amqp::Result<Option<Vec<u8>>> {
        Ok(self.held.lock().unwrap().get(key).cloned())
    }
    fn delete(&self, key: &str) -> acemq_amqp::Result<()> {
        *self.deleted.lock().unwrap() += 1;
        self.held.lock().unwrap().remove(key);
        Ok(())
    }
}

#[test]
fn every_vector_case_decodes_as_the_family_says() {
    let v = vector();
    assert_eq!(
        v["threshold_default_bytes"].as_u64().unwrap() as usize,
        acemq_amqp::patterns::claim_check::DEFAULT_CLAIM_CHECK_THRESHOLD
    );
    let store = MemoryStore::default();
    let codec = ClaimCheckCodec::new(BytesCodec, store.clone());
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7);
    for case in cases {
        let body = hex(case["body_hex"].as_str().unwrap());
        let m = Message::new(body.clone());
        match case["decodes_as"].as_str().unwrap() {
            "inline" => {
                let payload = hex(case["payload_hex"].as_str().unwrap());
                assert!(!is_claim_check(&body), "{case}");
                assert_eq!(claim_key_of(&body), None);
                assert_eq!(m.decode::<Vec<u8>>(&codec).unwrap(), payload, "{case}");
                // The JSON delegate reads the same inline bytes.
                let json = ClaimCheckCodec::new(JsonCodec, store.clone());
                assert_eq!(
                    m.decode::<Value>(&json).unwrap(),
                    serde_json::from_slice::<Value>(&payload).unwrap()
                );
            }
            "claim" => {
                let key = case["key"].as_str().unwrap();
                assert!(is_claim_check(&body), "{case}");
                assert_eq!(claim_key_of(&body), Some(key));
                store
                    .held
                    .lock()
                    .unwrap()
                    .insert(key.to_string(), b"stored payload".to_vec());
                assert_eq!(m.decode::<Vec<u8>>(&codec).unwrap(), b"stored payload");
            }
            "delegate" => {
                assert!(!is_claim_check(&body), "{case}");
                assert_eq!(claim_key_of(&body), None, "{case}");
                // Handed to the delegate whole and untouched.
                assert_eq!(m.decode::<Vec<u8>>(&codec).unwrap(), body, "{case}");
            }
            other => panic!("unknown case {other}"),
        }
    }
    assert_eq!(*store.deleted.lock().unwrap(), 0, "the codec never deletes");
}

#[test]
fn below_the_threshold_inline_at_or_above_it_stored_and_zero_offloads_everything() {
    let store = MemoryStore::default();
    let codec = ClaimCheckCodec::new(BytesCodec, store.clone()).threshold(8);
    assert_eq!(codec.content_type(), "application/octet-stream");

    let small = Message::encode(&codec, &vec![1u8; 7]).unwrap();
    assert_eq!(small.body, [&[0xAC, 0x01, 0x00][..], &[1u8; 7]].concat());
    assert_eq!(
        small.content_type.as_deref(),
        Some("application/octet-stream")
    );
    assert!(small.headers.is_empty(), "no header is written");
    assert_eq!(
        small.envelope.claim, None,
        "x-acemq-claim is the application's"
    );

    let at = Message::encode(&codec, &vec![2u8; 8]).unwrap();
    assert!(is_claim_check(&at.body));
    let key = claim_key_of(&at.body).unwrap().to_string();
    assert_eq!(at.body, [&[0xAC, 0x01, 0x01][..], key.as_bytes()].concat());
    assert_eq!(store.held.lock().unwrap()[&key], vec![2u8; 8]);
    assert_eq!(at.decode::<Vec<u8>>(&codec).unwrap(), vec![2u8; 8]);

    let everything = ClaimCheckCodec::new(JsonCodec, store.clone()).threshold(0);
    let m = Message::encode(&everything, &serde_json::json!({"a": 1})).unwrap();
    assert!(is_claim_check(&m.body));
    assert_eq!(m.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        store.held.lock().unwrap()[claim_key_of(&m.body).unwrap()],
        br#"{"a":1}"#
    );
    assert_eq!(
        m.decode::<Value>(&everything).unwrap(),
        serde_json::json!({"a": 1})
    );
    assert_eq!(*store.deleted.lock().unwrap(), 0, "the codec never deletes");
}

/// Redeems a claim check naming `key` through `codec`: the error it must give, whether the
/// codec called it fatal (dead-lettered at once), and whether it is the store's I/O failure
/// (retried).
fn redeem_err(codec: &impl Codec, key: &[u8]) -> (Error, bool, bool) {
    let body = [&[0xAC, 0x01, 0x01][..], key].concat();
    let err = Message::new(body).decode::<Vec<u8>>(codec).unwrap_err();
    let Error::Codec { source, .. } = &err else {
        panic!("{err}")
    };
    let fatal = source.downcast_ref::<acemq_amqp::FatalError>().is_some();
    let io = matches!(source.downcast_ref::<Error>(), Some(Error::Io { .. }));
    (err, fatal, io)
}

#[test]
fn a_missing_claim_is_fatal_and_a_failing_store_is_not() {
    let store = MemoryStore::default();
    let codec = ClaimCheckCodec::new(BytesCodec, store);
    let (err, fatal, _) = redeem_err(&codec, b"gone");
    assert!(fatal, "{err}");
    assert!(
        err.to_string().contains("\"gone\" is not in the store"),
        "{err}"
    );

    // A key the filesystem store refuses can never be redeemed either: fatal, with the reason.
    let dir = tempfile::tempdir().unwrap();
    let fs = ClaimCheckCodec::new(
        BytesCodec,
        FilesystemClaimCheckStore::new(dir.path()).unwrap(),
    );
    let (err, fatal, _) = redeem_err(&fs, b"../../etc/passwd");
    assert!(fatal, "{err}");
    assert!(err.to_string().contains("leave the store's root"), "{err}");

    // A store that fails (its disk, its network) may work on the next attempt: not fatal.
    #[derive(Debug)]
    struct Failing;
    impl ClaimCheckStore for Failing {
        fn put(&self, _: &[u8]) -> acemq_amqp::Result<String> {
            Ok("k".into())
        }
        fn get(&self, _: &str) -> acemq_amqp::Result<Option<Vec<u8>>> {
            Err(Error::Io {
                context: "reading a claim check".into(),
                source: std::io::Error::other("the disk went away"),
            })
        }
        fn delete(&self, _: &str) -> acemq_amqp::Result<()> {
            Ok(())
        }
    }
    let failing = ClaimCheckCodec::new(BytesCodec, Failing);
    let (err, fatal, io) = redeem_err(&failing, b"k");
    assert!(!fatal && io, "{err}");
}

#[test]
fn the_filesystem_store_refuses_every_key_that_could_leave_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let store = FilesystemClaimCheckStore::new(dir.path().join("claims")).unwrap();
    let refused = vector()["filesystem_store_keys_refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .chain(["a\\b".to_string(), "a//b".to_string(), "./a".to_string()])
        .collect::<Vec<_>>();
    assert!(refused.len() >= 7);
    for key in &refused {
        for result in [
            store.get(key).map(|_| ()),
            store.delete(key),
            store.path_of(key).map(|_| ()),
        ] {
            match result {
                Err(Error::InvalidName { kind, .. }) => assert_eq!(kind, "claim-check key"),
                other => panic!("key {key:?} was not refused: {other:?}"),
            }
        }
    }
    // Nothing was created outside the root.
    let outside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(outside.len(), 1, "only the root itself");
}

#[test]
fn the_filesystem_store_writes_atomically_and_reads_keys_with_directories() {
    let dir = tempfile::tempdir().unwrap();
    let store = FilesystemClaimCheckStore::new(dir.path()).unwrap();
    let key = store.put(b"payload").unwrap();
    assert!(!key.is_empty());
    assert_eq!(store.get(&key).unwrap().as_deref(), Some(&b"payload"[..]));
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![key.clone()], "no temporary file left behind");
    store.delete(&key).unwrap();
    assert_eq!(store.get(&key).unwrap(), None);
    store.delete(&key).unwrap(); // deleting a missing key is fine

    // Another library's key with directories (the vector's).
    std::fs::create_dir_all(dir.path().join("orders/2026")).unwrap();
    std::fs::write(dir.path().join("orders/2026/abcd"), b"{}").unwrap();
    assert_eq!(
        store.get("orders/2026/abcd").unwrap().as_deref(),
        Some(&b"{}"[..])
    );
}

/// The family's stores write payloads readable by their owner only (Python's `mkstemp`, 0600):
/// a claim-check directory is often a shared mount, and a payload is the message's whole body.
#[cfg(unix)]
#[test]
fn a_filesystem_claim_check_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let store = FilesystemClaimCheckStore::new(dir.path()).unwrap();
    let key = store.put(b"a private payload").unwrap();
    let mode = std::fs::metadata(store.path_of(&key).unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "the payload's file mode is {:o}",
        mode & 0o777
    );
}

#[test]
fn a_one_mib_payload_round_trips_through_the_broker_as_a_claim_check() {
    let (conn, _clean, q) = support::declared_consumed_queue("claim-1mib");
    let dir = tempfile::tempdir().unwrap();
    let store = FilesystemClaimCheckStore::new(dir.path()).unwrap();
    let codec = ClaimCheckCodec::new(BytesCodec, store);
    let payload: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();

    let publisher = conn.publisher().unwrap();
    let m = Message::encode(&codec, &payload).unwrap();
    assert!(m.body.len() < 100, "the broker carries the key only");
    publisher.publish("", &q, m).unwrap();

    let got = Arc::new(Mutex::new(None::<(Vec<u8>, Vec<u8>)>));
    let g = got.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().codec(codec.clone()))
        .unwrap()
        .start(move |m: &Message| {
            let decoded: Vec<u8> = m.payload()?;
            *g.lock().unwrap() = Some((m.body.clone(), decoded));
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(eventually(WAIT, || got.lock().unwrap().is_some()));
    consumer.close().unwrap();
    let (body, decoded) = got.lock().unwrap().take().unwrap();
    assert!(is_claim_check(&body));
    assert_eq!(decoded, payload);
    // The codec never deletes: the payload is still in the store.
    let key = claim_key_of(&body).unwrap();
    assert_eq!(codec.store().get(key).unwrap().unwrap(), payload);
    publisher.close().unwrap();
}

#[test]
fn a_message_whose_claim_is_gone_is_dead_lettered_with_the_reason() {
    let (conn, _clean, q) = support::declared_consumed_queue("claim-gone");
    let dir = tempfile::tempdir().unwrap();
    let store = FilesystemClaimCheckStore::new(dir.path()).unwrap();
    let codec = ClaimCheckCodec::new(BytesCodec, store).threshold(0);
    let m = Message::encode(&codec, &vec![9u8; 10]).unwrap();
    let key = claim_key_of(&m.body).unwrap().to_string();
    codec.store().delete(&key).unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, m).unwrap();
    publisher.close().unwrap();

    let consumer = conn
        .consumer(&q, ConsumerOptions::new().codec(codec))
        .unwrap()
        .start(|m: &Message| {
            let _: Vec<u8> = m.payload()?;
            Ok(Outcome::Accept)
        })
        .unwrap();
    let dlq = acemq_amqp::dead_letter_queue(&q);
    assert!(eventually(WAIT, || conn
        .queue_info(&dlq)
        .map(|i| i.message_count == 1)
        .unwrap_or(false)));
    consumer.close().unwrap();
    let raw = support::raw::Raw::open();
    let (props, _, body) = raw.get(&dlq).expect("the dead-lettered copy");
    assert_eq!(
        claim_key_of(&body),
        Some(key.as_str()),
        "the body as it was"
    );
    let error = props
        .headers()
        .as_ref()
        .and_then(|h| h.get("x-acemq-error").cloned());
    let text = format!("{error:?}");
    assert!(
        text.contains("FatalError") && text.contains("not in the store"),
        "{text}"
    );
    raw.close();
}

/// A claim key that tries to leave the filesystem store's root can never be redeemed: the
/// message goes to `.dlq` on its first attempt, with the store's reason, and the messages behind
/// it are handled (not retried round and round).
#[test]
fn a_claim_key_leaving_the_store_root_is_dead_lettered_at_once_with_the_reason() {
    let (conn, _clean, q) = support::declared_consumed_queue("claim-traversal");
    let dir = tempfile::tempdir().unwrap();
    let store = FilesystemClaimCheckStore::new(dir.path().join("claims")).unwrap();
    let codec = ClaimCheckCodec::new(BytesCodec, store).threshold(0);
    let publisher = conn.publisher().unwrap();
    let hostile = [&[0xAC, 0x01, 0x01][..], b"../../etc/passwd"].concat();
    publisher
        .publish("", &q, Message::new(hostile.clone()))
        .unwrap();
    let good = Message::encode(&codec, &vec![7u8; 10]).unwrap();
    publisher.publish("", &q, good).unwrap();
    publisher.close().unwrap();

    let handled = Arc::new(Mutex::new(Vec::new()));
    let h = handled.clone();
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .codec(codec)
                .retry(acemq_amqp::RetryPolicy::fixed(5, Duration::from_millis(50))),
        )
        .unwrap()
        .start(move |m: &Message| {
            let payload: Vec<u8> = m.payload()?;
            h.lock().unwrap().push(payload);
            Ok(Outcome::Accept)
        })
        .unwrap();
    let dlq = acemq_amqp::dead_letter_queue(&q);
    assert!(eventually(WAIT, || handled.lock().unwrap().len() == 1
        && conn
            .queue_info(&dlq)
            .map(|i| i.message_count == 1)
            .unwrap_or(false)));
    consumer.close().unwrap();
    assert_eq!(handled.lock().unwrap()[0], vec![7u8; 10]);
    let dead = conn.get(&dlq).unwrap().expect("the dead-lettered copy");
    assert_eq!(dead.body, hostile, "the body as it was");
    assert_eq!(dead.envelope.attempt, 1, "never retried");
    let error = dead.envelope.error.clone().unwrap_or_default();
    assert!(
        error.contains("FatalError")
            && error.contains("../../etc/passwd")
            && error.contains("leave the store's root"),
        "{error}"
    );
}
