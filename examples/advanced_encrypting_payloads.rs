//! Encrypting payloads: the family's encrypted codec (AES-GCM, `AE 01 len key-id nonce
//! ciphertext+tag`) around the JSON codec. The broker only ever sees ciphertext; the consumer
//! with the key reads the order; a key rotation keeps old messages readable by key id.
//! Run: `cargo run --example advanced_encrypting_payloads --features encryption`.

use acemq_amqp::codecs::encrypted::{
    generate_key, key_id_of, EncryptedCodec, EncryptionKey, Keyring,
};
use acemq_amqp::{JsonCodec, Message, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    // In a service the keys come from a secret store (`key_from_base64`), never from code.
    let old = Keyring::of("2026-10", generate_key())?;
    let sender = EncryptedCodec::new(JsonCodec, old.clone());
    let connection = ex::connect()?;
    let queue = ex::name("encrypted");
    connection.declare_queue(&QueueSpec::new(&queue).classic())?;
    let publisher = connection.publisher()?;
    let order = serde_json::json!({"order_id": "o-1", "card": "4111 1111 1111 1111"});
    let message = Message::encode(&sender, &order)?;
    println!(
        "published {} bytes under key {:?}; the card number is not in them: {}",
        message.body.len(),
        key_id_of(&message.body).unwrap_or("-"),
        !message.body.windows(4).any(|w| w == b"4111")
    );
    publisher.publish("", &queue, message)?;

    // The keys rotate: new messages use "2026-11", and the old key still reads old ones.
    let rotated = old
        .with_key(EncryptionKey::new("2026-11", generate_key())?)
        .use_key("2026-11")?;
    let receiver = EncryptedCodec::new(JsonCodec, rotated);
    let got = connection.get(&queue)?.expect("the encrypted order");
    let back: serde_json::Value = got.decode(&receiver)?;
    println!("the consumer with the keys read: {back}");

    let stranger = EncryptedCodec::new(JsonCodec, Keyring::of("2026-10", generate_key())?);
    publisher.publish("", &queue, Message::encode(&sender, &order)?)?;
    let got = connection.get(&queue)?.expect("the second copy");
    match got.decode::<serde_json::Value>(&stranger) {
        Err(e) => println!("a consumer with the wrong key gets: {e} (a consumer dead-letters it)"),
        Ok(v) => println!("unexpected: {v}"),
    }
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
