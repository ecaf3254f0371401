//! The crate docs (`src/lib.rs`) stay true to `Cargo.toml` (issue 37, item 15): their feature
//! table names every feature, no more, and says yes in its default column for exactly the
//! default ones. No broker needed.

use std::collections::BTreeSet;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).expect(path)
}

/// `Cargo.toml`'s `[features]`: each feature and what it turns on (`default` included).
fn cargo_features() -> Vec<(String, String)> {
    let manifest = read("Cargo.toml");
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[features]")
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.split_once('=').expect("a `name = [...]` line");
            (name.trim().to_string(), value.trim().to_string())
        })
        .collect()
}

/// The crate docs' `## Features` table: each row's features (its first cell may name several)
/// and whether its default column says yes.
fn documented_features() -> Vec<(String, bool)> {
    let lib = read("src/lib.rs");
    let section = lib
        .split("//! ## Features")
        .nth(1)
        .expect("src/lib.rs has a `## Features` section");
    let mut rows = Vec::new();
    for line in section.lines().skip(1) {
        let Some(row) = line.strip_prefix("//! |") else {
            if rows.is_empty() && line.trim() == "//!" {
                continue;
            }
            break;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        if cells[0] == "feature" || cells[0].starts_with("---") {
            continue;
        }
        let default = match cells[1] {
            "yes" => true,
            "no" => false,
            other => panic!("the default column says {other:?} for {}", cells[0]),
        };
        for name in cells[0].split(',') {
            let name = name.trim().trim_matches('`');
            rows.push((name.to_string(), default));
        }
    }
    rows
}

#[test]
fn the_crate_docs_feature_table_names_every_feature_of_cargo_toml_and_its_defaults() {
    let features = cargo_features();
    assert_eq!(
        features.len(),
        18,
        "Cargo.toml's [features] as read: {features:?}"
    );
    let defaults: BTreeSet<String> = features
        .iter()
        .find(|(name, _)| name == "default")
        .expect("a default feature list")
        .1
        .trim_matches(['[', ']'])
        .split(',')
        .map(|f| f.trim().trim_matches('"').to_string())
        .filter(|f| !f.is_empty())
        .collect();
    let in_cargo: BTreeSet<String> = features
        .iter()
        .map(|(name, _)| name.clone())
        .filter(|name| name != "default")
        .collect();
    let table = documented_features();
    let in_docs: BTreeSet<String> = table.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(
        in_docs.len(),
        table.len(),
        "a feature appears twice in the table"
    );
    assert_eq!(
        in_docs, in_cargo,
        "src/lib.rs's feature table and Cargo.toml's [features] differ"
    );
    let documented_defaults: BTreeSet<String> = table
        .iter()
        .filter(|(_, default)| *default)
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(
        documented_defaults, defaults,
        "the table's default column and Cargo.toml's default features differ"
    );
}
