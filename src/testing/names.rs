//! [`TestNames`]: queue, exchange and table names no other test uses.

use std::sync::atomic::{AtomicU64, Ordering};

/// The longest test name kept in a queue or exchange name (the start is cut off).
const MAX_TEST_IN_QUEUE: usize = 120;
/// The longest suffix (`what`) kept in a queue or exchange name.
const MAX_WHAT_IN_QUEUE: usize = 60;
/// The longest test name kept in a table name (PostgreSQL allows 63 bytes in all).
const MAX_TEST_IN_TABLE: usize = 26;
/// The longest suffix kept in a table name.
const MAX_WHAT_IN_TABLE: usize = 14;

/// PostgreSQL's limit on an identifier, in bytes.
const MAX_TABLE: usize = 63;

static INSTANCES: AtomicU64 = AtomicU64::new(0);

/// Names for one test's queues, exchanges and tables, unique across the tests running at once
/// (in this process and in others) and readable in the management UI.
///
/// A name is made of the test's name, what it is for, the process id and a number for this
/// `TestNames` value: `names.queue("orders")` in test `consume::retries_twice` of process 4242
/// is `test.consume.retries_twice.orders.4242-7`. The same `what` on the same value gives the
/// same name every time, so it can be asked for again where it is needed; two values (two
/// tests, or one test that makes two) never share a name.
///
/// Queue and exchange names stay under 255 bytes (room is left for the retry rungs'
/// `.retry.30s`, `.dlq`, `.parked`); table names are plain lowercase identifiers of at most 63
/// bytes (`t_retries_twice_outbox_4242_7`), as the SQL stores require. Long test names are cut
/// from the start, where the module path is.
///
/// Pair it with [`Cleanup`](super::Cleanup) to delete what the test declared.
#[derive(Clone, Debug)]
pub struct TestNames {
    test: String,
    instance: u64,
}

impl TestNames {
    /// Names for the test running on this thread: the test harness names each test's thread
    /// after the test (`module::test_name`). Off the harness (a doctest, `main`), the thread's
    /// name, or `test` for an unnamed thread.
    pub fn current() -> TestNames {
        let thread = std::thread::current();
        TestNames::new(thread.name().unwrap_or("test"))
    }

    /// Names for the test called `test` (any text: `::` and other characters outside
    /// `[A-Za-z0-9_-]` become `.`).
    pub fn new(test: &str) -> TestNames {
        let mut name: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '.'
                }
            })
            .collect();
        while name.contains("..") {
            name = name.replace("..", ".");
        }
        let name = name.trim_matches('.');
        TestNames {
            test: if name.is_empty() {
                "test".to_string()
            } else {
                name.to_string()
            },
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The test's name as it appears in the names (`consume.retries_twice`).
    pub fn test(&self) -> &str {
        &self.test
    }

    /// A queue name: `test.{test}.{what}.{pid}-{n}`.
    pub fn queue(&self, what: &str) -> String {
        format!(
            "test.{}.{}.{}-{}",
            tail(&self.test, MAX_TEST_IN_QUEUE),
            head(&clean(what, '.'), MAX_WHAT_IN_QUEUE),
            std::process::id(),
            self.instance
        )
    }

    /// An exchange name, of the same form as [`queue`](Self::queue) with `.x` after `what`
    /// (exchanges and queues have separate names on the broker; the suffix only tells them
    /// apart in listings).
    pub fn exchange(&self, what: &str) -> String {
        format!(
            "test.{}.{}.x.{}-{}",
            tail(&self.test, MAX_TEST_IN_QUEUE),
            head(&clean(what, '.'), MAX_WHAT_IN_QUEUE),
            std::process::id(),
            self.instance
        )
    }

    /// A table name, a plain lowercase SQL identifier of at most 63 bytes:
    /// `t_{test}_{what}_{pid}_{n}` (the test's last path segment, cut to fit).
    pub fn table(&self, what: &str) -> String {
        let last = self.test.rsplit('.').next().unwrap_or(&self.test);
        let test = clean(last, '_').to_ascii_lowercase();
        let what = clean(what, '_').to_ascii_lowercase();
        let mut name = format!(
            "t_{}_{}_{}_{}",
            tail(&test, MAX_TEST_IN_TABLE),
            head(&what, MAX_WHAT_IN_TABLE),
            std::process::id(),
            self.instance
        );
        while name.contains("__") {
            name = name.replace("__", "_");
        }
        // Room is left for every pid and instance number; this only guards the limit.
        name.truncate(MAX_TABLE);
        name
    }
}

/// `text` with every character outside `[A-Za-z0-9_-]` (and `-` for a table) replaced by `sep`.
fn clean(text: &str, sep: char) -> String {
    let s: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || (c == '-' && sep == '.') {
                c
            } else {
                sep
            }
        })
        .collect();
    let s = s.trim_matches(sep);
    if s.is_empty() {
        "x".to_string()
    } else {
        s.to_string()
    }
}

/// The first `max` bytes of an ASCII string.
fn head(s: &str, max: usize) -> &str {
    &s[..s.len().min(max)]
}

/// The last `max` bytes of an ASCII string.
fn tail(s: &str, max: usize) -> &str {
    &s[s.len().saturating_sub(max)..]
}

#[cfg(test)]
mod tests {
    use super::TestNames;

    fn assert_identifier(name: &str) {
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with(|c: char| c.is_ascii_lowercase()), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{name}"
        );
    }

    #[test]
    fn names_are_stable_per_value_and_unique_across_values() {
        let a = TestNames::new("consume::retries_twice");
        let b = TestNames::new("consume::retries_twice");
        assert_eq!(a.test(), "consume.retries_twice");
        assert_eq!(a.queue("orders"), a.queue("orders"));
        assert_ne!(a.queue("orders"), b.queue("orders"));
        assert_ne!(a.queue("orders"), a.queue("payments"));
        let pid = std::process::id().to_string();
        assert!(a
            .queue("orders")
            .starts_with("test.consume.retries_twice.orders."));
        assert!(a.queue("orders").contains(&pid));
        assert_ne!(a.queue("orders"), a.exchange("orders"));
        let t = a.table("Outbox-Store");
        assert!(t.starts_with("t_retries_twice_outbox_store_"), "{t}");
        assert_identifier(&t);
    }

    #[test]
    fn long_and_odd_names_stay_within_the_limits() {
        let long = "m::".repeat(200) + "a_test_with_a_rather_long_name_indeed";
        let n = TestNames::new(&long);
        let q = n.queue(&"w".repeat(300));
        assert!(q.len() + ".retry.30s".len() <= 255, "{}", q.len());
        assert!(q.contains("a_test_with_a_rather_long_name_indeed"));
        let t = n.table("a table/with spaces");
        assert!(t.len() <= 63, "{t}");
        assert_identifier(&t);
        let odd = TestNames::new("::");
        assert_eq!(odd.test(), "test");
        assert_identifier(&odd.table(""));
    }
}
