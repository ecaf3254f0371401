//! Development certificates: the family's test certificate authority writes a CA, a broker
//! certificate and a client certificate (P-256, marked `ACEMQ DEVELOPMENT ONLY - DO NOT TRUST`)
//! and a `rabbitmq.conf` to point a local broker at them — for your TLS tests, never production.
//! Run: `cargo run --example advanced_development_certificates --features test-ca [dir]`.

use acemq_amqp::test_ca::TestCa;

#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> acemq_amqp::Result<()> {
    let keep = std::env::args().nth(1);
    let temporary = tempfile::tempdir().map_err(|e| acemq_amqp::Error::Io {
        context: "making a temporary directory".into(),
        source: e,
    })?;
    let dir = keep
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| temporary.path().to_path_buf());
    let made = TestCa::new().broker_host("localhost").generate(&dir)?;
    println!("wrote to {}:", made.directory.display());
    let mut files: Vec<_> = std::fs::read_dir(&made.directory)
        .map_err(|e| acemq_amqp::Error::Io {
            context: "listing the directory".into(),
            source: e,
        })?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().to_string()))
        .collect();
    files.sort();
    for f in files {
        println!("  {f}");
    }
    println!(
        "the CA certificate starts: {}",
        made.ca_cert.lines().next().unwrap_or_default()
    );
    println!(
        "trust it in a test with ConnectionOptions::tls_root_certificate and \
         allow_development_certificates(true) (feature tls: its marker is refused otherwise), \
         and start a broker with the rabbitmq.conf written beside it"
    );
    Ok(())
}
