use acemq_amqp::{Connection, Message, Outcome, QueueSpec};
use std::time::Duration;

fn main() -> acemq_amqp::Result<()> {
    // RabbitMQ by default; `-- memory://demo` runs it on the in-process broker instead.
    let default = "amqp://guest:guest@127.0.0.1:5672/".to_string();
    let connection = Connection::open(&std::env::args().nth(1).unwrap_or(default))?;
    connection.declare_queue(&QueueSpec::new("quickstart"))?; // durable: a quorum queue
    let (done, handled) = std::sync::mpsc::sync_channel(1);
    let consumer = connection.consume("quickstart", move |m: &Message| {
        println!("handled {}: {}", m.id(), String::from_utf8_lossy(&m.body));
        let _ = done.try_send(()); // an Err is a failed attempt; the default policy allows one, so it is dead-lettered
        Ok(Outcome::Accept)
    })?;
    let order = Message::new(r#"{"order_id":"o-1"}"#);
    connection.publisher()?.publish("", "quickstart", order)?; // returns once confirmed
    handled
        .recv_timeout(Duration::from_secs(10))
        .expect("handled in time");
    consumer.close()?; // lets running handlers finish, requeues what was not started
    for q in ["quickstart", "quickstart.dlq", "quickstart.parked"] {
        connection.delete_queue(q)?;
    }
    connection.close()
}
