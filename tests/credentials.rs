//! The broker login from a file or the environment, on the real broker: read at connect, the
//! URL's own user and password replaced, a bad one refused without the secret in the error.

mod support;

use acemq_amqp::credentials::Credentials;
use acemq_amqp::{credentials, ConnectionOptions};

/// The test broker's address without its login.
fn bare_url() -> String {
    let url = support::amqp_url();
    match url.split_once('@') {
        Some((_, rest)) => format!("amqp://{rest}"),
        None => url,
    }
}

#[test]
fn a_login_from_a_file_or_the_environment_opens_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rabbitmq");
    std::fs::write(&file, "guest:guest\n").unwrap();
    let conn = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(bare_url().replace("amqp://", "amqp://nobody:wrong@"))
            .credentials(credentials::from_file(&file, None)),
    )
    .expect("the file's login replaces the URL's");
    conn.close().unwrap();
    std::env::set_var("ACEMQ_IT_USER_c1", "guest");
    std::env::set_var("ACEMQ_IT_PASS_c1", "guest");
    let conn =
        acemq_amqp::Connection::open_with(
            ConnectionOptions::new().address(bare_url()).credentials(
                credentials::from_environment("ACEMQ_IT_USER_c1", "ACEMQ_IT_PASS_c1"),
            ),
        )
        .expect("the environment's login");
    conn.close().unwrap();
}

#[test]
fn a_wrong_or_missing_login_is_refused_without_the_secret() {
    let e = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(bare_url())
            .connect_timeout(std::time::Duration::from_secs(5))
            .credentials(Credentials::new("guest", "not-the-password-9d2")),
    )
    .unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(!text.contains("not-the-password-9d2"), "{text}");
    let e =
        acemq_amqp::Connection::open_with(
            ConnectionOptions::new().address(bare_url()).credentials(
                credentials::from_environment("ACEMQ_IT_UNSET_USER_c2", "ACEMQ_IT_UNSET_PASS_c2"),
            ),
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("ACEMQ_IT_UNSET_USER_c2 is not set"),
        "{e}"
    );
}
