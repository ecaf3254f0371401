//! The README's example is the file `examples/quickstart.rs`, word for word, so the example a
//! newcomer copies is one that compiles and runs (`cargo run --example quickstart`).

#[test]
fn the_readme_example_is_examples_quickstart_word_for_word() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/quickstart.rs"
    ))
    .expect("examples/quickstart.rs");
    let start = readme
        .find("```rust\n")
        .expect("the README has a Rust example")
        + "```rust\n".len();
    let end = start + readme[start..].find("```").expect("the example block ends");
    assert_eq!(
        &readme[start..end],
        example,
        "README.md's first Rust block differs from examples/quickstart.rs: copy the file into it"
    );
}
