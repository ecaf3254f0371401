//! A default build of the library has no clap, indicatif or tokio (issue 36): the command
//! line's dependencies live in its own crate (`acemq-cli/`), and the library is sold as "no async
//! runtime". Reads `cargo tree` offline from the lock file; fails (never skips) when it cannot.

use std::process::Command;

#[test]
fn a_default_library_build_has_no_clap_indicatif_or_tokio() {
    let out = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "-p",
            "acemq-amqp",
            "--prefix",
            "none",
        ])
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // One `name vX.Y.Z …` line per crate (repeated ones end with `(*)`).
    let crates: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"acemq-amqp") && crates.contains(&"amiquip"),
        "cargo tree printed no dependency tree:\n{stdout}"
    );
    for forbidden in ["clap", "indicatif", "tokio"] {
        assert!(
            !crates.contains(&forbidden),
            "a default build of acemq-amqp depends on {forbidden}, which belongs to the command \
             line (acemq-cli) only; `cargo tree -e normal -p acemq-amqp -i {forbidden}` shows \
             why:\n{stdout}"
        );
    }
}
