//! The password never appears in logs, even with every log at trace level (amiquip logs its
//! handshake, password included, at debug level). Its own test binary: it installs the global
//! logger.

mod support;

use acemq_amqp::{ConnectionOptions, Message, QueueSpec};

#[test]
fn the_password_is_not_logged_at_any_level() {
    assert!(support::logs::capture(log::LevelFilter::Trace));
    // guest's password is `guest`; the SASL response amiquip would log is "\0guest\0guest".
    let conn = support::connect_with(ConnectionOptions::new().address(support::amqp_url()));
    let q = support::unique("logs");
    conn.declare_queue(&QueueSpec::new(&q).auto_delete(true))
        .unwrap();
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
    conn.delete_queue(&q).unwrap();
    conn.close().unwrap();
    assert_eq!(
        log::max_level(),
        log::LevelFilter::Trace,
        "the level was restored"
    );
    let lines = support::logs::lines();
    assert!(
        lines.iter().any(|l| l.starts_with("amiquip")),
        "amiquip did log"
    );
    let leaked: Vec<&String> = lines
        .iter()
        .filter(|l| {
            l.contains("guest\\u{0}guest") || l.contains("guest\0guest") || l.contains("StartOk")
        })
        .collect();
    assert!(leaked.is_empty(), "password in the logs: {leaked:?}");
}
