//! Claim check: a 2 MiB scan goes to a store (here a directory) and the broker carries only
//! `AC 01 01` + its key; a small note goes inline (`AC 01 00` + the bytes). The consumer side
//! reads both with the same codec.
//! Run: `cargo run --example intermediate_claim_check`.

use acemq_amqp::patterns::claim_check::{
    claim_key_of, is_claim_check, ClaimCheckCodec, FilesystemClaimCheckStore,
};
use acemq_amqp::{BytesCodec, Error, Message, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::Io {
        context: "making a temporary directory".into(),
        source: e,
    })?;
    let codec = ClaimCheckCodec::new(BytesCodec, FilesystemClaimCheckStore::new(dir.path())?);
    let connection = ex::connect()?;
    let queue = ex::name("documents");
    connection.declare_queue(&QueueSpec::new(&queue).classic())?;
    let publisher = connection.publisher()?;

    let scan: Vec<u8> = (0..2 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let note = b"signed, see scan".to_vec();
    for payload in [&scan, &note] {
        let message = Message::encode(&codec, payload)?;
        println!(
            "{} bytes sent as a {}-byte body ({})",
            payload.len(),
            message.body.len(),
            match claim_key_of(&message.body) {
                Some(key) => format!("claim check, key {key}"),
                None => "inline".into(),
            }
        );
        publisher.publish("", &queue, message)?;
    }
    for _ in 0..2 {
        let m = connection.get(&queue)?.expect("a document");
        let back: Vec<u8> = m.decode(&codec)?;
        println!(
            "received a {}-byte body (claim check: {}) and read back {} bytes",
            m.body.len(),
            is_claim_check(&m.body),
            back.len()
        );
    }
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
